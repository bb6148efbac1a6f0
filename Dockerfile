# everystep worker image: the zipapp on a slim Python of the same version.
#
#   docker build -t everystep .
#   docker run --rm -e EVERYSTEP_DATABASE_URL=postgres://... \
#     -e EVERYSTEP_WORKFLOWS=shop -v "$PWD/examples:/app/workflows:ro" everystep
#
# Workflows go in /app/workflows (on EVERYSTEP_PATH), mounted or copied in a
# derived image. The bundled packages are extracted at build time, so the
# container runs with a read-only root filesystem.

FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY everystep everystep
COPY config config
COPY runtime runtime
COPY scripts/build-pyz scripts/build-pyz
RUN scripts/build-pyz python3 /dist/everystep.pyz

FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SHIV_ROOT=/opt/everystep/extracted \
    EVERYSTEP_PATH=/app/workflows \
    EVERYSTEP_DATABASE_URL=sqlite:////app/data/everystep.sqlite3
COPY --from=build /dist/everystep.pyz /opt/everystep/everystep.pyz
RUN python3 /opt/everystep/everystep.pyz --version \
    && useradd --system --uid 10001 --no-create-home --home-dir /app everystep \
    && mkdir -p /app/workflows /app/data \
    && chown everystep /app/data
WORKDIR /app
USER 10001
STOPSIGNAL SIGTERM
ENTRYPOINT ["python3", "/opt/everystep/everystep.pyz"]
CMD ["worker"]
