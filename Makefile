# ctrain front door. `make run`: install what is missing, build, prepare the bundled corpus,
# train configs/smoke.toml and print the validation loss and a sample. `make test`: the same
# setup, then the whole CPU test suite.
BUILD ?= build
CTRAIN := $(BUILD)/ctrain
DATA := data/fortunes/train.h5 data/fortunes/val.h5
MESON_OPTS ?=

.PHONY: all run test deps build data bench clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja: | deps
	meson setup $(BUILD) $(MESON_OPTS)

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

$(DATA): | build
	$(CTRAIN) prepare --out-dir data/fortunes

data: build $(DATA)

run: data
	$(CTRAIN) train configs/smoke.toml

test: data
	meson test -C $(BUILD) --suite unit --suite integration --print-errorlogs

bench: data
	bench/cpu_train.sh $(CTRAIN)

clean:
	rm -rf $(BUILD)
