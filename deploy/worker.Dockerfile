# A GPU worker image: the official vLLM image with the tailgate binary added; the
# container runs `tailgate worker`, which starts vLLM (`vllm` on the image's PATH) and
# fronts it with the sidecar.
#   docker build -f deploy/worker.Dockerfile -t tailgate-vllm --build-arg VERSION=$(git describe --always) --build-arg REVISION=$(git rev-parse HEAD) .
#   docker run --gpus all --ipc=host -v tailgate-worker:/data \
#     -e TAILGATE_CLUSTER_TOKEN=tgc-... -e TAILGATE_MESH_AUTHKEY=tskey-auth-... \
#     tailgate-vllm --mesh --mesh-hostname tg-gpu-a --gateway http://tg-gateway:8081 --listen :9000 \
#       --model meta-llama/Llama-3.1-8B-Instruct
# Arguments after the image name replace CMD (the example worker below) and follow the
# ENTRYPOINT's fixed flags. Without --mesh, give --listen 0.0.0.0:9000 and
# --advertise http://<address the gateway reaches>:9000 instead.
# vLLM is pinned to the release the launcher was last checked against (README, "vLLM
# versions"); change the tag and the README's version together.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=devel
# The commit, for `tailgate version`: the build context leaves .git out, so the go command
# cannot stamp it (--build-arg REVISION=$(git rev-parse HEAD)).
ARG REVISION=
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" -o /out/tailgate . && mkdir -p /out/data

FROM vllm/vllm-openai:v0.25.1
COPY --from=build /out/tailgate /usr/local/bin/tailgate
# A user of its own; /data holds the worker's state, the tailnet node's and the model cache.
# The uid is the gateway image's (deploy/Dockerfile): a worker beside the gateway reads the
# cluster token the gateway wrote (mode 0600) from its volume, as compose.yaml's does.
RUN groupadd --system --gid 65532 tailgate && \
  useradd --system --uid 65532 --gid 65532 --home-dir /data --create-home --shell /usr/sbin/nologin tailgate
USER 65532:65532
ENV HOME=/data HF_HOME=/data/huggingface
VOLUME /data
EXPOSE 9000
# Healthy once the sidecar says the engine is ready (its /health, with the cluster token
# from $TAILGATE_CLUSTER_TOKEN); the start period covers a first model download. With
# --cluster-token-file, or another --listen port, override it (compose.yaml does).
HEALTHCHECK --interval=30s --timeout=5s --start-period=30m --retries=3 \
  CMD ["/usr/local/bin/tailgate", "healthcheck", "--url", "http://127.0.0.1:9000/health"]
# The image's own ENTRYPOINT is ["vllm", "serve"]: replaced, tailgate starts vLLM itself.
ENTRYPOINT ["/usr/local/bin/tailgate", "worker", "--data", "/data", "--engine", "vllm", "--log-format", "json"]
CMD ["--mesh", "--mesh-hostname", "tg-gpu", "--gateway", "http://tg-gateway:8081", "--listen", ":9000", "--model", "Qwen/Qwen2.5-0.5B-Instruct"]
