# everystep worker image: the zipapp's packages, unpacked at build time, on
# a slim Python of the same version.
#
#   docker build -t everystep .
#   docker run --rm --name worker-1 -e EVERYSTEP_NAME=worker-1 --stop-timeout 40 \
#     --read-only -e EVERYSTEP_WORKFLOWS=shop -v "$PWD/examples:/app/workflows:ro" everystep
#
# Workflows go in /app/workflows (on EVERYSTEP_PATH), mounted or copied in a
# derived image. The default database is SQLite in the /app/data volume; set
# EVERYSTEP_DATABASE_URL for another. The code is one read-only copy in
# /opt/everystep, so the container runs with a read-only root filesystem,
# as any uid (/app/data is writable by group 0, the group of a uid that
# /etc/passwd does not name). The health check asks the worker's /healthz
# on EVERYSTEP_METRICS_PORT.

# The base's python3 builds the zipapp and runs the image: its compiled
# dependencies are that interpreter's.
ARG BASE=python:3.12-slim

FROM ${BASE} AS build
WORKDIR /src
COPY scripts/build-pyz scripts/pyz-main.py scripts/unpack-pyz scripts/
COPY pyproject.toml ./
# README.md is the package's long description and nothing else: left out of
# the build context (.dockerignore), so editing it rebuilds nothing.
RUN echo "everystep: durable workflow execution for Django." > README.md
COPY everystep everystep
COPY config config
COPY runtime runtime
# One copy of the code: the zipapp is built, unpacked into /opt/everystep,
# and left behind in this stage.
RUN scripts/build-pyz python3 /tmp/everystep.pyz \
    && scripts/unpack-pyz /tmp/everystep.pyz /opt/everystep

FROM ${BASE}
ARG BASE
ARG VERSION=0.1.0
# The repository's URL, e.g. --build-arg SOURCE=https://github.com/OWNER/everystep
ARG SOURCE=""
LABEL org.opencontainers.image.title="everystep" \
      org.opencontainers.image.description="Durable workflow execution for Django: every step recorded, every interrupted run resumed." \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.base.name="${BASE}"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    EVERYSTEP_PATH=/app/workflows \
    EVERYSTEP_DATABASE_URL=sqlite:////app/data/everystep.sqlite3 \
    EVERYSTEP_METRICS_PORT=9464
COPY --from=build /opt/everystep /opt/everystep
RUN ln -s /opt/everystep/bin/everystep /usr/local/bin/everystep \
    && everystep --version \
    && useradd --system --uid 10001 --gid 0 --no-create-home --home-dir /app everystep \
    && mkdir -p /app/workflows /app/data \
    && chown 10001:0 /app/data \
    && chmod 0775 /app/data
VOLUME /app/data
WORKDIR /app
USER 10001
EXPOSE 9464
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ['EVERYSTEP_METRICS_PORT'] + '/healthz', timeout=4)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/everystep/bin/everystep"]
CMD ["worker"]
