# The Paritywatch backend + dashboard. No torch: the service never needs it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
RUN useradd --create-home --uid 10001 paritywatch

COPY pyproject.toml setup.py README.md ./
COPY backend ./backend
COPY trainer_hooks ./trainer_hooks
COPY migrations ./migrations
COPY demo ./demo
COPY frontend ./frontend
RUN pip install ".[server]"

USER paritywatch
EXPOSE 8321
# The schema is upgraded at start (Alembic), so replicas can roll forward one after another.
CMD ["paritywatch", "serve", "--host", "0.0.0.0", "--port", "8321"]
