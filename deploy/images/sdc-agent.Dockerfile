# sdc-guard/sdc-agent:VERSION: sdc-agent from the release bundle and the
# torch 2.11.0 libraries it links (libtorch and the CUDA libraries of torch's
# Linux wheel, which the bundle does not carry). Build context: a directory
# holding the bundle tarball (./sdc release puts it in dist/):
#
#   cp dist/sdc-guard-0.2.0-linux-x86_64.tar.gz ctx/
#   docker build -f deploy/images/sdc-agent.Dockerfile -t sdc-guard/sdc-agent:0.2.0 ctx/
#
# NVML and the CUDA driver come from the host through the NVIDIA container
# runtime, never from the image. Base: Ubuntu 24.04, as for sdcd; Python is
# needed only to fetch torch's wheel, in the first stage.
FROM ubuntu:24.04 AS torch
ARG TORCH_VERSION=2.11.0
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-venv python3-pip \
 && python3 -m venv /venv \
 && /venv/bin/pip install --no-cache-dir "torch==${TORCH_VERSION}" \
 && mkdir -p /opt/torch \
 && mv /venv/lib/python3*/site-packages/torch /venv/lib/python3*/site-packages/nvidia /opt/torch/

FROM ubuntu:24.04
ARG VERSION=0.2.0
# torch/lib finds its CUDA libraries at ../../nvidia (its RUNPATH), so the
# two keep their relative places.
COPY --from=torch /opt/torch/torch/lib /opt/torch/torch/lib
COPY --from=torch /opt/torch/nvidia /opt/torch/nvidia
ENV SDC_TORCH_LIB=/opt/torch/torch/lib
ADD sdc-guard-${VERSION}-linux-x86_64.tar.gz /opt/
RUN ln -s /opt/sdc-guard-${VERSION}-linux-x86_64 /opt/sdc-guard \
 && ln -s /opt/sdc-guard/bin/sdc-agent /usr/local/bin/sdc-agent \
 && /usr/local/bin/sdc-agent --version

# Writes only /tmp (each diagnostic's scratch files; an emptyDir) and the
# relay socket's directory /run/sdc-guard (a hostPath), so the root
# filesystem can be read-only. Runs as the manifests' runAsUser: uid 0 with
# every capability dropped, because kubelet creates that hostPath owned by
# root, mode 0755, and only its owner may create the socket there
# (deploy/eks/base/agent-daemonset.yaml says more).
USER 0:0
# Prometheus metrics and /healthz (--metrics_listen=0.0.0.0:9465).
EXPOSE 9465
ENTRYPOINT ["/usr/local/bin/sdc-agent"]
