"""coordl.DataLoader inside a Lightning Trainer (CPU; DDP with gloo when DEVICES > 1).

    lightning_job.py ROOT OUT_DIR DEVICES USE_DISTRIBUTED_SAMPLER WORKERS EPOCHS [CKPT_EVERY] [RESUME_FROM] [ELASTIC]

Every rank records, for each training step, (epoch, batch_idx, the batch's item ids = labels
of the one-image-per-class dataset, sha256 of the image bytes) into OUT_DIR/steps-rank<r>.json.
CKPT_EVERY: ModelCheckpoint(every_n_train_steps=...) into OUT_DIR/ckpt; RESUME_FROM: a
checkpoint to resume fit from; ELASTIC=1: with the coordl.ElasticResume callback. The record also
holds the trainer's global_step and current_epoch at the end of fit.
"""

import hashlib
import json
import os
import sys
from datetime import timedelta

import lightning as L
import torch

import coordl


class Model(L.LightningModule):
    def __init__(self, root: str, workers: int) -> None:
        super().__init__()
        self.root, self.workers = root, workers
        self.layer = torch.nn.Linear(3 * 8 * 8, 30)
        self.steps: list = []

    def train_dataloader(self):
        ds = coordl.ImageFolder(self.root, transform="train", size=8, seed=7)
        return coordl.DataLoader(ds, batch_size=4, shuffle=True, num_workers=self.workers,
                                 persistent_workers=self.workers > 0)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        digest = hashlib.sha256(images.contiguous().numpy().tobytes()).hexdigest()
        self.steps.append([self.current_epoch, batch_idx, labels.tolist(), digest])
        x = images.float().flatten(1) / 255
        return torch.nn.functional.cross_entropy(self.layer(x), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    root, out, devices = sys.argv[1], sys.argv[2], int(sys.argv[3])
    use_ds, workers, epochs = sys.argv[4] == "1", int(sys.argv[5]), int(sys.argv[6])
    every = int(sys.argv[7]) if len(sys.argv) > 7 and sys.argv[7] != "0" else None
    resume = sys.argv[8] if len(sys.argv) > 8 and sys.argv[8] != "0" else None
    elastic = len(sys.argv) > 9 and sys.argv[9] == "1"
    callbacks = [L.pytorch.callbacks.ModelCheckpoint(dirpath=os.path.join(out, "ckpt"), every_n_train_steps=every,
                                                     save_top_k=-1, filename="{step}")] if every else []
    callbacks += [coordl.ElasticResume()] if elastic else []
    # a rank stuck in a collective raises within 90 s (not gloo's 30 minutes): the test then shows
    # which one, and where (tests/integrations/conftest.py gives a job 150 s)
    strategy = L.pytorch.strategies.DDPStrategy(timeout=timedelta(seconds=90)) if devices > 1 else "auto"
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy,
                        max_epochs=epochs, use_distributed_sampler=use_ds, logger=False,
                        enable_checkpointing=bool(every), callbacks=callbacks, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    model = Model(root, workers)
    trainer.fit(model, ckpt_path=resume)
    loader = trainer.train_dataloader
    record = {"steps": model.steps, "is_coordl": isinstance(loader, coordl.DataLoader),
              "sampler": type(loader.sampler).__name__, "world": trainer.world_size,
              "global_step": trainer.global_step, "current_epoch": trainer.current_epoch}
    with open(os.path.join(out, f"steps-rank{trainer.global_rank}.json"), "w") as f:
        json.dump(record, f)
    # gloo's threads must stop before the interpreter does: a group left to its teardown aborts the
    # process now and then ("terminate called without an active exception", torch's documented
    # shutdown is destroy_process_group at the end of main)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
