/* stat every file of one open folder, without the GIL and without a Python object per file.
 *
 * stat_names(dir_fd, names, count, out) -> failures
 *
 * `names` is a bytes-like object holding `count` file names, each ended by a NUL byte;
 * `out` a writable buffer of at least 4 * count int64, filled as four columns of `count`:
 * st_size, st_mtime in ns, st_ctime in ns, st_ino. Each name is stat'ed relative to the open
 * folder `dir_fd`, following symlinks, as os.stat(name, dir_fd=dir_fd) does; a name that cannot
 * be stat'ed (a broken link, a file removed meanwhile) gets the row (-1, 0, 0, 0), the row
 * coordl/manifest_scan.py's os.stat fallback writes, and is counted in the return value.
 *
 * coordl/manifest_scan.py calls it once per folder of a dataset scan. Python's own loop
 * (os.stat per name) spends most of its time building a stat_result of 20 fields per file;
 * here a file costs its fstatat(2) and four stores. The GIL is released for the whole
 * folder, so the scan's threads overlap their waits on cold metadata.
 * The build is optional (setup.py): without it the scan uses libc's statx through ctypes,
 * or os.stat.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__APPLE__)
#define MTIME(st) ((st).st_mtimespec)
#define CTIME(st) ((st).st_ctimespec)
#else
#define MTIME(st) ((st).st_mtim)
#define CTIME(st) ((st).st_ctim)
#endif

static PyObject *stat_names(PyObject *self, PyObject *args)
{
    int fd;
    Py_buffer names, out;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "iy*nw*", &fd, &names, &count, &out))
        return NULL;
    PyObject *result = NULL;
    if (count < 0 || out.len < (Py_ssize_t)(4 * sizeof(int64_t)) * count) {
        PyErr_Format(PyExc_ValueError, "stat_names: out holds %zd bytes, %zd names need %zd",
                     out.len, count, (Py_ssize_t)(4 * sizeof(int64_t)) * (count < 0 ? 0 : count));
        goto done;
    }
    /* every name must end inside the buffer: count NULs, the last one at its end */
    const char *base = (const char *)names.buf;
    Py_ssize_t nuls = 0;
    for (Py_ssize_t i = 0; i < names.len; i++)
        nuls += base[i] == '\0';
    if (nuls != count || (count > 0 && base[names.len - 1] != '\0')) {
        PyErr_Format(PyExc_ValueError, "stat_names: names holds %zd NUL-ended names, not %zd",
                     nuls, count);
        goto done;
    }
    int64_t *col = (int64_t *)out.buf;
    Py_ssize_t failures = 0;
    Py_BEGIN_ALLOW_THREADS
    const char *p = base;
    for (Py_ssize_t i = 0; i < count; i++) {
        struct stat st;
        if (fstatat(fd, p, &st, 0) == 0) {
            col[i] = (int64_t)st.st_size;
            col[count + i] = (int64_t)MTIME(st).tv_sec * 1000000000 + MTIME(st).tv_nsec;
            col[2 * count + i] = (int64_t)CTIME(st).tv_sec * 1000000000 + CTIME(st).tv_nsec;
            col[3 * count + i] = (int64_t)st.st_ino;
        } else {
            col[i] = -1;
            col[count + i] = col[2 * count + i] = col[3 * count + i] = 0;
            failures++;
        }
        p += strlen(p) + 1;
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(failures);
done:
    PyBuffer_Release(&names);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"stat_names", stat_names, METH_VARARGS,
     "stat_names(dir_fd, names, count, out) -> failures: stat the NUL-ended names relative to "
     "dir_fd into out's four int64 columns (size, mtime_ns, ctime_ns, ino); (-1, 0, 0, 0) where "
     "a name cannot be stat'ed."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_statnames",
    "stat the files of one folder in C, without the GIL (coordl/manifest/walk.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__statnames(void)
{
    return PyModule_Create(&module);
}
