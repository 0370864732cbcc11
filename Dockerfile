# The Konduit image: the `konduit` command (worker, dashboard, db migrate, ...) from the wheel
# built out of this checkout, in a virtual environment, run as a non-root user.
#
#   docker build -t konduit .                        # the dashboard's extra ([web]) included
#   docker build --build-arg EXTRAS=web,otel -t konduit .
#   docker run --rm konduit --version
#
# Your workflows are yours to add: an image of your own FROM this one that installs your
# project's wheel into /opt/konduit/venv (or copies a package into /app, the working directory,
# which `konduit worker` imports from), then `konduit worker mypackage.workflows:app`. docs/containers.md has the
# rest; compose.yaml and deploy/kubernetes/ run it. Without a registry (this project's CI):
# deploy/container/build-local.sh builds the base from Debian's packages and this on top.

# Any image with Python 3.11 or later and its venv module (with ensurepip): an official Python
# slim image by default. Both stages use it, so the virtual environment's interpreter path is the same.
ARG BASE=python:3.11-slim

# -- build: the wheel (not the checkout) and a virtual environment with it installed ----------
FROM ${BASE} AS build
# The extras installed with it: web (the dashboard and the HTTP API), otel (traces). The
# embedded server ([embedded]) has no place in a container: point KONDUIT_DATABASE_URL at one.
ARG EXTRAS=web
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
# The virtual environment's own pip builds the wheel too (a base may have no pip of its own).
# tzdata: the time zone database for schedules' zones (zoneinfo), which slim bases leave out.
RUN python3 -m venv /opt/konduit/venv \
 && /opt/konduit/venv/bin/pip wheel --quiet --no-deps --wheel-dir /dist . \
 && wheel="$(ls /dist/konduit_pg-*.whl)" \
 && /opt/konduit/venv/bin/pip install --quiet "${wheel}${EXTRAS:+[$EXTRAS]}" tzdata \
 && /opt/konduit/venv/bin/konduit --version

# -- runtime: the virtual environment alone, no build tools, no sources ------------------------
FROM ${BASE}
LABEL org.opencontainers.image.title="konduit" \
      org.opencontainers.image.description="Durable DAG workflows on PostgreSQL with an exactly-once join" \
      org.opencontainers.image.url="https://pypi.org/project/konduit-pg/" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed, numeric uid (Kubernetes' runAsNonRoot can check it) that owns nothing it runs.
RUN groupadd --gid 10001 konduit \
 && useradd --uid 10001 --gid 10001 --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin konduit \
 && mkdir -p /app && chown konduit:konduit /app
COPY --from=build /opt/konduit/venv /opt/konduit/venv
ENV PATH=/opt/konduit/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    KONDUIT_LOG_FORMAT=json
WORKDIR /app
USER 10001:10001
# The dashboard's port (konduit dashboard --host 0.0.0.0 --port 8090, with a token).
EXPOSE 8090
# `konduit health` connects to KONDUIT_DATABASE_URL and checks konduit's schema is current;
# a worker's container can ask for more with `konduit health --worker` (compose.yaml does).
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s --retries=3 \
    CMD ["konduit", "health"]
ENTRYPOINT ["konduit"]
CMD ["--help"]
