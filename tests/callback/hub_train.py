"""Fine-tune models loaded from the Hugging Face cache with ``PublishCallback``; print what each run did.

Usage: ``HF_HOME=... HF_HUB_OFFLINE=1 python hub_train.py JOBS_JSON``, where JOBS_JSON is a list of
``{"model": ID, SNAPSHOT or null (a model built in code), "out": DIR, "options": {...}}`` (the
callback's options). Each job prints ``CKPTPUB_RESULT {"warnings": [...], "base_published_on":
THREAD or null, "steps": [...]}``. A process of its own: huggingface_hub reads ``HF_HOME`` when
it is imported, and the tests' process imported it long before.
"""

import json
import logging
import sys

from support import tiny_model


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def run(job: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ckptpub import PublishCallback

    torch.set_num_threads(1)
    if job["model"] is None:
        model, tokenizer = tiny_model.build_model(), tiny_model.build_tokenizer()
    else:  # by hub id (or snapshot path), as users load a downloaded base
        model = AutoModelForCausalLM.from_pretrained(job["model"])
        tokenizer = AutoTokenizer.from_pretrained(job["model"])
    records = Records()
    logging.getLogger("ckptpub").addHandler(records)
    try:
        callback = PublishCallback(**job["options"])
        trainer = tiny_model.make_trainer(
            job["out"], model=model, tokenizer=tokenizer, max_steps=10, save_steps=5, callbacks=[callback]
        )
        trainer.train()
    finally:
        logging.getLogger("ckptpub").removeHandler(records)
    published = [r.threadName for r in records.records if "published the base model" in r.getMessage()]
    return {
        "warnings": [r.getMessage() for r in records.records if r.levelno >= logging.WARNING],
        "base_published_on": published[0] if published else None,
        "steps": [p.folder for p in callback.published],
    }


if __name__ == "__main__":
    logging.getLogger("ckptpub").setLevel(logging.INFO)
    for job in json.loads(sys.argv[1]):
        print("CKPTPUB_RESULT " + json.dumps(run(job)), flush=True)
