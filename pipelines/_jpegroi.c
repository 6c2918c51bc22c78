/* Region-of-interest JPEG decode with libjpeg-turbo: only the rows and columns a crop reads.
 *
 * decode(data, denom, x0, y0, x1, y1, channels) decodes the JPEG in `data` at scale 1/denom
 * (DCT scaling, denom in 1, 2, 4, 8) and returns only the region [x0, x1) x [y0, y1) of the
 * scaled image, widened on the left and right by jpeg_crop_scanline's iMCU alignment:
 *
 *   (pixels: bytes, xoff, y0, width, height, scaled_width, scaled_height)
 *
 * `pixels` holds height rows of width * channels bytes (channels 3: RGB, 4: RGBX), and
 * pixel (0, 0) is pixel (xoff, y0) of the scaled image. Rows above y0 are skipped with
 * jpeg_skip_scanlines, rows below y1 are never decoded (jpeg_abort_decompress). Grayscale
 * becomes RGB. Returns None for colour spaces it leaves to the caller (CMYK, YCCK, ...).
 *
 * header(data) -> (width, height, supported) reads the header only.
 *
 * Errors, and the warnings that mean corrupt data (premature end of file, bad Huffman code, a
 * marker inside the image data, ...), raise ValueError with libjpeg's message; the warnings
 * about metadata only (JFIF revision, Adobe transform code, ICC marker) are ignored, as
 * Pillow ignores them. In a single-scan file the bytes below the region, which libjpeg never
 * reads, are scanned for a marker that cannot be there or a missing EOI (roi_check_tail):
 * pipelines/roi.py says why that makes this decoder at least as strict as Pillow's full
 * decode. The GIL is released while libjpeg runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>

/* jpeg_crop_scanline/jpeg_skip_scanlines exist since libjpeg-turbo 1.5, but combined with fancy
   upsampling they had crashes and wrong rows fixed up to 2.1: older builds are not worth the risk.
   The build is optional (setup.py): without this extension coordl decodes with Pillow. */
#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 2001000
#error "pipelines/_jpegroi.c needs libjpeg-turbo >= 2.1"
#endif

struct roi_error {
    struct jpeg_error_mgr pub; /* must be first */
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

static void roi_error_exit(j_common_ptr cinfo)
{
    struct roi_error *err = (struct roi_error *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void roi_emit_message(j_common_ptr cinfo, int msg_level)
{
    /* msg_level -1 is a warning. Those about the pixel data (corrupt data, premature end of
       file) are errors here; those about metadata alone leave the pixels right and are ignored,
       as are trace messages (msg_level >= 0). */
    struct roi_error *err = (struct roi_error *)cinfo->err;
    int code = err->pub.msg_code;

    if (msg_level >= 0 || code == JWRN_JFIF_MAJOR || code == JWRN_ADOBE_XFORM || code == JWRN_BOGUS_ICC)
        return;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void roi_output_message(j_common_ptr cinfo)
{
    (void)cinfo; /* never print to stderr */
}

/* Everything the error path must release, outside the frame setjmp saved. */
struct roi_state {
    struct jpeg_decompress_struct cinfo;
    struct roi_error err;
    int created;
    PyThreadState *thread; /* non-NULL while the GIL is released */
    PyObject *out;
    JSAMPROW rows[16];
};

/* The entropy-coded bytes [p, end) that libjpeg has not read, of a single-scan file: they may
   hold only stuffed 0xFF 0x00 pairs, RSTn markers when there is a restart interval, 0xFF fill
   bytes, and then EOI. `marker` is a marker libjpeg already took out of them (cinfo's
   unread_marker), or 0. Returns 0, or -1 with `message` set. No libjpeg call, no GIL needed. */
static int roi_check_tail(const unsigned char *p, const unsigned char *end, int marker, int restarts,
                          char *message)
{
    for (;;) {
        if (marker == 0xD9)
            return 0; /* EOI: what follows it is not part of the image */
        if (marker != 0 && !(restarts && marker >= 0xD0 && marker <= 0xD7)) {
            snprintf(message, JMSG_LENGTH_MAX,
                     "Corrupt JPEG data: marker 0x%02x inside the image data, %ld bytes before the "
                     "end of the file", marker, (long)(end - p));
            return -1;
        }
        p = memchr(p, 0xFF, (size_t)(end - p));
        if (p == NULL)
            break;
        while (p < end && *p == 0xFF) /* one 0xFF, or fill bytes before a marker */
            p++;
        if (p == end)
            break;
        marker = *p++; /* 0x00 is a stuffed 0xFF: image data */
    }
    strcpy(message, "Premature end of JPEG file: no end-of-image marker after the image data");
    return -1;
}

/* A zeroed state for `view`'s bytes with the error handlers set; on failure releases `view`,
   sets the Python error and returns NULL. The caller still calls setjmp(st->err.jump). */
static struct roi_state *roi_new_state(Py_buffer *view)
{
    struct roi_state *st;

    if (view->len < 4 || (unsigned long long)view->len > 0xFFFFFFFFull) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "Not a JPEG file: too short or too long");
        return NULL;
    }
    st = (struct roi_state *)PyMem_Calloc(1, sizeof(*st));
    if (st == NULL) {
        PyBuffer_Release(view);
        PyErr_NoMemory();
        return NULL;
    }
    st->cinfo.err = jpeg_std_error(&st->err.pub);
    st->err.pub.error_exit = roi_error_exit;
    st->err.pub.emit_message = roi_emit_message;
    st->err.pub.output_message = roi_output_message;
    return st;
}

static PyObject *roi_decode(PyObject *self, PyObject *args)
{
    Py_buffer view;
    int denom, x0, y0, x1, y1, channels;
    struct roi_state *st;
    JDIMENSION xoff, width, height, scaled_w, scaled_h;
    unsigned int line_bytes;
    int unsupported = 0;
    PyObject *result = NULL;

    (void)self;
    if (!PyArg_ParseTuple(args, "y*iiiiii:decode", &view, &denom, &x0, &y0, &x1, &y1, &channels))
        return NULL;
    if (!(denom == 1 || denom == 2 || denom == 4 || denom == 8) || (channels != 3 && channels != 4)
        || x0 < 0 || y0 < 0 || x1 <= x0 || y1 <= y0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "decode: bad scale, channels or region");
        return NULL;
    }
    st = roi_new_state(&view);
    if (st == NULL)
        return NULL;

    if (setjmp(st->err.jump)) {
        /* libjpeg failed: st->err.message says why. */
        if (st->thread != NULL) {
            PyEval_RestoreThread(st->thread);
            st->thread = NULL;
        }
        if (st->created)
            jpeg_destroy_decompress(&st->cinfo);
        Py_CLEAR(st->out);
        PyErr_SetString(PyExc_ValueError, st->err.message);
        PyMem_Free(st);
        PyBuffer_Release(&view);
        return NULL;
    }

    st->thread = PyEval_SaveThread();
    jpeg_create_decompress(&st->cinfo);
    st->created = 1;
    jpeg_mem_src(&st->cinfo, (const unsigned char *)view.buf, (unsigned long)view.len);
    jpeg_read_header(&st->cinfo, TRUE);
    switch (st->cinfo.jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
        break;
    default:
        unsupported = 1;
    }
    if (!unsupported) {
        st->cinfo.out_color_space = channels == 4 ? JCS_EXT_RGBX : JCS_EXT_RGB;
        st->cinfo.scale_num = 1;
        st->cinfo.scale_denom = (unsigned int)denom;
        jpeg_start_decompress(&st->cinfo);
        scaled_w = st->cinfo.output_width;
        scaled_h = st->cinfo.output_height;
        if ((JDIMENSION)x1 > scaled_w)
            x1 = (int)scaled_w;
        if ((JDIMENSION)y1 > scaled_h)
            y1 = (int)scaled_h;
        if (x0 >= x1 || y0 >= y1) {
            strcpy(st->err.message, "region outside the image");
            longjmp(st->err.jump, 1);
        }
        xoff = (JDIMENSION)x0;
        width = (JDIMENSION)(x1 - x0);
        if (xoff > 0 || width < scaled_w)
            jpeg_crop_scanline(&st->cinfo, &xoff, &width); /* aligns xoff down to an iMCU */
        height = (JDIMENSION)(y1 - y0);
        line_bytes = st->cinfo.output_width * (unsigned int)channels;

        PyEval_RestoreThread(st->thread);
        st->thread = NULL;
        st->out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)line_bytes * height);
        if (st->out == NULL) {
            jpeg_destroy_decompress(&st->cinfo);
            PyMem_Free(st);
            PyBuffer_Release(&view);
            return NULL;
        }
        st->thread = PyEval_SaveThread();

        if (y0 > 0 && jpeg_skip_scanlines(&st->cinfo, (JDIMENSION)y0) != (JDIMENSION)y0) {
            strcpy(st->err.message, "could not skip to the region's first row");
            longjmp(st->err.jump, 1);
        }
        {
            unsigned char *base = (unsigned char *)PyBytes_AS_STRING(st->out);
            JDIMENSION done = 0;
            while (done < height) {
                JDIMENSION want = height - done, got, i;
                if (want > 16)
                    want = 16;
                for (i = 0; i < want; i++)
                    st->rows[i] = base + (size_t)(done + i) * line_bytes;
                got = jpeg_read_scanlines(&st->cinfo, st->rows, want);
                if (got == 0) {
                    strcpy(st->err.message, "decoder returned no rows");
                    longjmp(st->err.jump, 1);
                }
                done += got;
            }
        }
        width = st->cinfo.output_width;
        /* A single-scan file is read as it is decoded: check the part libjpeg did not read. (A
           progressive or multi-scan file was read to its end by jpeg_start_decompress.) */
        if (!st->cinfo.progressive_mode && st->cinfo.comps_in_scan == st->cinfo.num_components) {
            const unsigned char *start = (const unsigned char *)view.buf;
            const unsigned char *end = start + view.len;
            const unsigned char *p = st->cinfo.src->next_input_byte;
            if (p >= start && p <= end
                && roi_check_tail(p, end, st->cinfo.unread_marker, st->cinfo.restart_interval != 0,
                                  st->err.message) != 0)
                longjmp(st->err.jump, 1);
        }
    }
    jpeg_abort_decompress(&st->cinfo); /* the rows below the region are never decoded */
    jpeg_destroy_decompress(&st->cinfo);
    st->created = 0;
    PyEval_RestoreThread(st->thread);
    st->thread = NULL;

    if (unsupported) {
        result = Py_NewRef(Py_None);
    } else {
        result = Py_BuildValue("(NIiIIII)", st->out, xoff, y0, width, height, scaled_w, scaled_h);
        st->out = NULL; /* stolen by N, also on failure */
    }
    PyMem_Free(st);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *roi_header(PyObject *self, PyObject *args)
{
    Py_buffer view;
    struct roi_state *st;
    PyObject *result;
    int supported;

    (void)self;
    if (!PyArg_ParseTuple(args, "y*:header", &view))
        return NULL;
    st = roi_new_state(&view);
    if (st == NULL)
        return NULL;
    if (setjmp(st->err.jump)) {
        if (st->created)
            jpeg_destroy_decompress(&st->cinfo);
        PyErr_SetString(PyExc_ValueError, st->err.message);
        PyMem_Free(st);
        PyBuffer_Release(&view);
        return NULL;
    }
    jpeg_create_decompress(&st->cinfo);
    st->created = 1;
    jpeg_mem_src(&st->cinfo, (const unsigned char *)view.buf, (unsigned long)view.len);
    jpeg_read_header(&st->cinfo, TRUE);
    supported = st->cinfo.jpeg_color_space == JCS_GRAYSCALE || st->cinfo.jpeg_color_space == JCS_YCbCr
                || st->cinfo.jpeg_color_space == JCS_RGB;
    result = Py_BuildValue("(IIO)", st->cinfo.image_width, st->cinfo.image_height,
                           supported ? Py_True : Py_False);
    jpeg_destroy_decompress(&st->cinfo);
    PyMem_Free(st);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *roi_version(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
#ifdef LIBJPEG_TURBO_VERSION
#define ROI_STR2(x) #x
#define ROI_STR(x) ROI_STR2(x)
    return PyUnicode_FromString(ROI_STR(LIBJPEG_TURBO_VERSION));
#else
    return PyUnicode_FromFormat("libjpeg %d", JPEG_LIB_VERSION);
#endif
}

static PyMethodDef roi_methods[] = {
    {"decode", roi_decode, METH_VARARGS,
     "decode(data, denom, x0, y0, x1, y1, channels) -> (pixels, xoff, y0, width, height, "
     "scaled_width, scaled_height) or None"},
    {"header", roi_header, METH_VARARGS,
     "header(data) -> (width, height, supported): parses the header only (GIL held: it is short)"},
    {"version", roi_version, METH_NOARGS, "the libjpeg(-turbo) version compiled against"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef roi_module = {
    PyModuleDef_HEAD_INIT, "_jpegroi", "Region-of-interest JPEG decode (libjpeg-turbo).", -1,
    roi_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpegroi(void)
{
    return PyModule_Create(&roi_module);
}
