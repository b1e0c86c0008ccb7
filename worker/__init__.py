"""The worker side: Celery tasks hosting one engine per GPU, and the offline batch runner."""
