# sdc-guard/sdcd:VERSION: sdcd and sdcctl from the release bundle, and kubectl
# for --actuator=eks. Build context: a directory holding the bundle tarball
# (./sdc release puts it in dist/) and a kubectl binary for your cluster's
# Kubernetes version (a static binary; it is not in the bundle):
#
#   cp dist/sdc-guard-0.2.0-linux-x86_64.tar.gz /path/to/kubectl ctx/
#   docker build -f deploy/images/sdcd.Dockerfile -t sdc-guard/sdcd:0.2.0 ctx/
#
# The bundle carries its own glibc and loader, so the base only supplies a
# shell for `kubectl exec` debugging and CA certificates: Ubuntu 24.04, a
# small, long-supported base that security scanners know.
FROM ubuntu:24.04

ARG VERSION=0.2.0

RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*

# Unpacked by ADD: /opt/sdc-guard-VERSION-linux-x86_64/{bin,libexec,lib,share}.
ADD sdc-guard-${VERSION}-linux-x86_64.tar.gz /opt/
COPY --chmod=0755 kubectl /usr/local/bin/kubectl
RUN ln -s /opt/sdc-guard-${VERSION}-linux-x86_64 /opt/sdc-guard \
 && ln -s /opt/sdc-guard/bin/sdcd /usr/local/bin/sdcd \
 && ln -s /opt/sdc-guard/bin/sdcctl /usr/local/bin/sdcctl \
 && /usr/local/bin/sdcd --version \
 && mkdir -p /var/lib/sdc && chown 65532:65532 /var/lib/sdc

# Nothing writes outside /var/lib/sdc (the database, a volume) and /tmp, so
# the root filesystem can be read-only. Runs as the manifests' runAsUser.
USER 65532:65532
WORKDIR /var/lib/sdc
# Trainer gRPC (grpc), the agents' gRPC (agents, --agent_listen) and
# Prometheus metrics (metrics); the admin service listens on 127.0.0.1:7401
# inside the pod and is not exposed.
EXPOSE 7400 7402 9464
ENTRYPOINT ["/usr/local/bin/sdcd"]
