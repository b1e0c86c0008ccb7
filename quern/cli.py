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
) -> None:
    """Run a batch file offline through the engine, writing results as they finish."""
    from worker.offline import run_batch_file

    summary = run_batch_file(input, output, model=model, resume=resume, dtype=dtype,
                             window=window, max_num_seqs=max_num_seqs, kv_cache_gb=kv_cache_gb)
    typer.echo(summary.describe(), err=True)
    raise typer.Exit(0 if summary.failed == 0 or summary.completed else 1)


def main() -> None:
    app()
