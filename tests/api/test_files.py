"""Uploads stream into chunked storage; reads, downloads and deletes are the owner's."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from store.models import FileChunk


def upload(client: TestClient, auth: dict, content: bytes, purpose: str = "batch",
           name: str = "requests.jsonl"):
    return client.post("/v1/files", headers=auth, data={"purpose": purpose},
                       files={"file": (name, content, "application/jsonl")})


def test_an_upload_is_stored_in_chunks_and_read_back_whole(
        client: TestClient, auth: dict, session: Session) -> None:
    content = b"".join(b'{"line": %d, "pad": "%s"}\n' % (i, b"x" * 50) for i in range(300))
    response = upload(client, auth, content)
    assert response.status_code == 200, response.text
    file = response.json()
    assert file["object"] == "file" and file["purpose"] == "batch"
    assert file["bytes"] == len(content) and file["filename"] == "requests.jsonl"
    chunks = session.scalar(select(func.count()).where(FileChunk.file_id == file["id"]))
    assert chunks == -(-len(content) // 4096)  # the test settings' 4 KiB chunks

    assert client.get(f"/v1/files/{file['id']}", headers=auth).json() == file
    downloaded = client.get(f"/v1/files/{file['id']}/content", headers=auth)
    assert downloaded.status_code == 200 and downloaded.content == content


def test_the_purpose_field_may_follow_the_file(client: TestClient, auth: dict) -> None:
    body = (b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\n"
            b"Content-Type: application/jsonl\r\n\r\n{\"a\": 1}\n\r\n"
            b"--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            b"--XyZ--\r\n")
    response = client.post("/v1/files", content=body,
                           headers={**auth, "Content-Type": "multipart/form-data; boundary=XyZ"})
    assert response.status_code == 200, response.text
    assert response.json()["bytes"] == len(b'{"a": 1}\n')


def test_deleting_a_file_removes_it_and_its_chunks(
        client: TestClient, auth: dict, session: Session) -> None:
    file_id = upload(client, auth, b'{"a": 1}\n' * 1000).json()["id"]
    deleted = client.delete(f"/v1/files/{file_id}", headers=auth)
    assert deleted.json() == {"id": file_id, "object": "file", "deleted": True}
    assert client.get(f"/v1/files/{file_id}", headers=auth).status_code == 404
    assert client.get(f"/v1/files/{file_id}/content", headers=auth).status_code == 404
    assert session.scalar(select(func.count()).where(FileChunk.file_id == file_id)) == 0


def test_an_upload_over_the_size_limit_is_refused_and_not_kept(
        make_client, auth: dict, session: Session) -> None:
    small = make_client(max_file_bytes=10_000)
    before = session.scalar(select(func.count()).select_from(FileChunk))
    response = upload(small, auth, b"x" * 20_000)
    assert response.status_code == 413
    assert response.json()["error"] == {"code": "file_too_large", "param": "file",
                                        "message": "the request body is larger than 10000 bytes"}
    assert session.scalar(select(func.count()).select_from(FileChunk)) == before


def test_an_upload_without_content_length_is_cut_off_at_the_limit(
        make_client, auth: dict) -> None:
    small = make_client(max_file_bytes=10_000)
    parts = [b"--B\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n",
             b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\n"]
    parts += [b"y" * 1000] * 30 + [b"\r\n--B--\r\n"]
    response = small.post("/v1/files", content=iter(parts),
                          headers={**auth, "Content-Type": "multipart/form-data; boundary=B"})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "file_too_large"
