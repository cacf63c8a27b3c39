# Pinned code generators: `make proto` installs exactly these.
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.5.1
GOBIN := $(shell go env GOPATH)/bin
# Stamp the VCS revision into the binaries (regctl version, regnode --version)
# when this is a git checkout, whatever GOFLAGS says; elsewhere (a tarball, a
# Docker build context without .git) build unstamped.
BUILDVCS := $(shell git rev-parse --is-inside-work-tree >/dev/null 2>&1 && echo -buildvcs=true)

.PHONY: all build run demo test vet proto bench fuzz tools clean-data

all: build

build:
	go build $(BUILDVCS) -o bin/regnode ./cmd/regnode
	go build $(BUILDVCS) -o bin/regctl ./cmd/regctl

## run: start one regnode on embedded etcd (API 127.0.0.1:7400, data ./regnode.data)
run: build
	./bin/regnode

## demo: seed 001's experiment live (regnode, backends A B C, a client through
## registry:///demo): a scripted story of failures and recoveries, then a summary;
## `go run ./cmd/regdemo -interactive` takes the seed's commands instead
demo:
	go run ./cmd/regdemo

## test: vet, then every test under the race detector; then the checks of
## the deployment files (a nested module: Prometheus' rule parser stays out
## of the main go.mod)
test:
	go vet ./...
	go test -race -count=1 -timeout 15m ./...
	cd deploy && go vet ./... && go test -count=1 ./...

## bench: registration throughput, ours against raw etcd, side by side; one
## pick of our balancer against grpc's round_robin; then every regbench
## scenario in its short form, flood included (a caller's List latency while
## another floods Registers, against idle; told apart by peer address, then
## with --auth by token alone) and scale (three regnode processes, 10,000
## instances, 1,000 subscribers in child processes; the full 100,000 /
## 10,000 by hand: go run ./cmd/regbench scale); table on stderr, JSON
## lines in bench.json (firstcall: process start to first successful call;
## propagate also against S xDS streams; probe: two pinned regnodes'
## probe rate against one's, up to 4,000 TCP checks; the full form by
## hand: go run ./cmd/regbench probe); then the prober's rate and each
## probe kind's cost (probes per CPU-second, TIME_WAIT left)
bench:
	go test -run '^$$' -bench Register -benchtime 4000x -count 1 ./internal/server/
	go test -run '^$$' -bench Pick -benchtime 200000x -count 1 ./balance/
	go run ./cmd/regbench all -short -json > bench.json
	go test -run '^$$' -bench . -benchtime 3x -count 1 ./prober/
	go test -run '^$$' -bench ProbeCost -benchtime 20000x -count 1 ./probe/

## fuzz: each fuzz target (record's decoder and validators, the token parser,
## the auth interceptor's metadata reading, the DNS query handler) for
## FUZZTIME, one after the other; a crasher lands in
## <package>/testdata/fuzz/<Target>/: commit it as a seed
FUZZTIME ?= 20s
FUZZ_TARGETS := ./record/:FuzzDecode ./record/:FuzzValidate ./record/:FuzzValidAddress ./record/:FuzzUnmarshal \
	./internal/token/:FuzzParse ./internal/token/:FuzzFromIncoming ./dnsapi/:FuzzServeDNS
fuzz:
	@for pt in $(FUZZ_TARGETS); do \
		p=$${pt%%:*}; t=$${pt##*:}; \
		echo "== $$p $$t"; \
		go test $$p -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) || exit 1; \
	done

tools:
	@command -v protoc >/dev/null || (apt-get update && apt-get install -y protobuf-compiler)
	go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

## proto: regenerate the committed Go code of proto/
proto: tools
	PATH="$(GOBIN):$$PATH" protoc -I proto \
		--go_out=proto --go_opt=paths=source_relative \
		--go-grpc_out=proto --go-grpc_opt=paths=source_relative \
		proto/registry/v1/registry.proto

clean-data:
	rm -rf regnode.data
