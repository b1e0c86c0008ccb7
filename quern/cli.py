"""`quern` subcommands. Each imports its package lazily, so `quern run` never loads the API
and `quern api` never loads torch."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="quern: a job-queue batch inference worker.")


@app.command()
def run(
    input: Path = typer.Argument(..., exists=True, dir_okay=False,
                                 help="OpenAI Batch input file (JSONL)."),
    output: Path = typer.Option(..., "-o", "--output", help="Where to write result lines."),
    model: str = typer.Option("smollm2", "--model", help="'smollm2', a HF directory or a .gguf."),
    resume: bool = typer.Option(False, "--resume",
                                help="Skip custom_ids already present in OUTPUT."),
    dtype: str = typer.Option("float32", "--dtype"),
    max_num_seqs: int = typer.Option(64, "--max-num-seqs"),
    kv_cache_gb: float = typer.Option(1.0, "--kv-cache-gb"),
    window: int = typer.Option(256, "--window",
                               help="Requests held in the engine at once (bounds memory)."),
    compile_model: bool = typer.Option(False, "--compile",
                                       help="torch.compile the model first (minutes on a "
                                            "small CPU; faster steps after)."),
) -> None:
    """Run a batch file offline through the engine, writing results as they finish."""
    from engine import ModelNotFoundError
    from worker.offline import run_batch_file

    try:
        summary = run_batch_file(input, output, model=model, resume=resume, dtype=dtype,
                                 window=window, max_num_seqs=max_num_seqs,
                                 kv_cache_memory_gb=kv_cache_gb, compile_model=compile_model)
    except (ModelNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(summary.describe(), err=True)
    raise typer.Exit(0 if summary.failed == 0 or summary.completed else 1)


@app.command()
def api(
    host: str = typer.Option("127.0.0.1", "--host", envvar="QUERN_API_HOST"),
    port: int = typer.Option(8000, "--port", envvar="QUERN_API_PORT"),
    workers: int = typer.Option(1, "--workers", help="uvicorn worker processes."),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Serve the REST API (settings from QUERN_* environment variables)."""
    import uvicorn

    uvicorn.run("api.app:create_app", factory=True, host=host, port=port, workers=workers,
                proxy_headers=True, log_level=log_level)


@app.command()
def worker(
    model: str = typer.Option("smollm2", "--model", help="'smollm2', a HF directory or a .gguf."),
    served_model_name: str = typer.Option(None, "--served-model-name",
                                          help="Queue name for the model (default: --model)."),
    device: str = typer.Option(None, "--device", help="cuda:N (pinned) or cpu; default: auto."),
    dtype: str = typer.Option(None, "--dtype", help="float32, bfloat16, float16; default: auto."),
    concurrency: int = typer.Option(8, "--concurrency",
                                    help="Messages in flight at once (Celery threads)."),
    max_num_seqs: int = typer.Option(64, "--max-num-seqs"),
    kv_cache_gb: float = typer.Option(1.0, "--kv-cache-gb", help="KV cache size on CPU."),
    compile_model: bool = typer.Option(False, "--compile",
                                       help="torch.compile the model at start-up."),
    log_level: str = typer.Option("INFO", "--log-level"),
) -> None:
    """Consume quern.MODEL.interactive then quern.MODEL.batch with one engine on one device."""
    from worker.celery_app import serve

    serve(model, device=device, dtype=dtype, concurrency=concurrency,
          served_model_name=served_model_name, loglevel=log_level,
          max_num_seqs=max_num_seqs, kv_cache_memory_gb=kv_cache_gb,
          compile_model=compile_model)


@app.command("reconcile")
def reconcile_jobs() -> None:
    """Re-send the messages of pending jobs that Redis lost (one pass; the API also runs it
    every maintenance interval)."""
    from store.db import session_scope
    from store.reconcile import reconcile
    from store.settings import get_settings

    settings = get_settings()
    with session_scope(settings) as session:
        report = reconcile(session, settings)
    typer.echo(report.describe())


db_app = typer.Typer(no_args_is_help=True, help="Database schema migrations (Alembic).")
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head")) -> None:
    """Migrate QUERN_DATABASE_URL's schema up to REVISION."""
    from store.migrate import upgrade

    upgrade(revision)


@db_app.command("downgrade")
def db_downgrade(revision: str = typer.Argument(..., help="e.g. -1 or base")) -> None:
    """Migrate the schema down to REVISION."""
    from store.migrate import downgrade

    downgrade(revision)


keys_app = typer.Typer(no_args_is_help=True, help="API keys.")
app.add_typer(keys_app, name="keys")


@keys_app.command("create")
def keys_create(tenant: str = typer.Option(..., "--tenant", help="Tenant name; made if new.")
                ) -> None:
    """Create an API key for TENANT and print it (it is shown only this once)."""
    from store.db import session_scope
    from store.tenants import create_api_key

    with session_scope() as session:
        row, key = create_api_key(session, tenant)
        tenant_id = row.id
    typer.echo(f"tenant {tenant} ({tenant_id})", err=True)
    typer.echo(key)


def main() -> None:
    app()
