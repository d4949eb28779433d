# One image for every tokenwire service: `docker run IMAGE gateway|assembler|telemetry|provision|...`.
# Built from uv.lock with a pinned uv (the same version as the Makefile), no dev dependencies,
# with the postgres extra (the cluster's store); not the demo extra (openai).
# Every locked dependency installs from a wheel on this glibc base (uvloop, httptools, msgspec,
# ... ship manylinux wheels for x86_64 and aarch64), so the image needs no compiler.

FROM python:3.11-slim AS build
RUN pip install --no-cache-dir uv==0.13.9
ENV UV_PROJECT_ENVIRONMENT=/opt/tokenwire \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never
WORKDIR /src
# Dependencies first, so a source change does not re-download them.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --extra postgres --no-install-project
COPY src ./src
RUN uv sync --frozen --no-dev --extra postgres --no-editable

FROM python:3.11-slim
# A fixed, non-root uid: Kubernetes' runAsNonRoot can check it, volumes can be chowned to it.
RUN groupadd --system --gid 10001 tokenwire \
    && useradd --system --uid 10001 --gid tokenwire --home-dir /var/lib/tokenwire \
       --create-home --shell /usr/sbin/nologin tokenwire
COPY --from=build /opt/tokenwire /opt/tokenwire
ENV PATH=/opt/tokenwire/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    TOKENWIRE_DATA_DIR=/var/lib/tokenwire
USER 10001:10001
WORKDIR /var/lib/tokenwire
EXPOSE 8080 9000 9465 9466
ENTRYPOINT ["tokenwire"]
CMD ["--help"]
