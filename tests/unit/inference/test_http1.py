"""Http1Pool against a real socket server whose every byte the test scripts."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agentrl.inference.http1 import ConnectFailed, Http1Pool, RequestFailed


def ok(body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


@dataclass
class Seen:
    conn: int  # which connection (0, 1, ...) carried it
    head: str
    body: bytes


@dataclass
class RawServer:
    """``answer(seen)`` returns the bytes to send, "close" or "hang"."""

    answer: Callable[[Seen], bytes | str]
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    url: str = ""
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # set at each request

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        conn, self.connections = self.connections, self.connections + 1
        try:
            while True:
                head = (await r.readuntil(b"\r\n\r\n")).decode()
                length = next(
                    int(line.split(":")[1])
                    for line in head.split("\r\n")
                    if line.lower().startswith("content-length:")
                )
                s = Seen(conn, head, await r.readexactly(length))
                self.seen.append(s)
                self.arrived.set()
                out = self.answer(s)
                if out == "close":
                    break
                if out == "hang":
                    await r.read()  # until the client gives up
                    break
                if isinstance(out, tuple):  # answer, then close
                    w.write(out[0])
                    await w.drain()
                    break
                assert isinstance(out, bytes)
                w.write(out)
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()


@asynccontextmanager
async def raw_server(
    answer: Callable[[Seen], bytes | str | tuple[bytes, str]], *, tls: ssl.SSLContext | None = None
) -> AsyncIterator[RawServer]:
    srv = RawServer(answer)
    server = await asyncio.start_server(srv.handle, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    srv.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    try:
        yield srv
    finally:
        server.close()
        with suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2)


def echo(s: Seen) -> bytes:
    return ok(s.body)


async def test_keep_alive_carries_every_request_on_one_connection():
    async with raw_server(echo) as srv, Http1Pool(srv.url) as pool:
        for i in range(20):
            assert await pool.post("/x", b'{"i":%d}' % i, timeout_s=5) == (200, b'{"i":%d}' % i)
    assert srv.connections == 1
    head = srv.seen[0].head
    assert head.startswith("POST /x HTTP/1.1\r\n") and "Content-Type: application/json" in head


def test_runs_on_uvloop():
    # Ray's async actors run their event loop on uvloop, whose transports are not
    # asyncio.Transport subclasses.
    uvloop = pytest.importorskip("uvloop")  # installed with vLLM: present wherever it runs

    async def main() -> list[tuple[int, bytes]]:
        async with raw_server(echo) as srv, Http1Pool(srv.url) as pool:
            return [await pool.post("/", b"%d" % i, timeout_s=5) for i in range(3)]

    assert uvloop.run(main()) == [(200, b"0"), (200, b"1"), (200, b"2")]


async def test_concurrent_requests_open_at_most_max_connections():
    async with raw_server(echo) as srv, Http1Pool(srv.url, max_connections=4) as pool:
        outs = await asyncio.gather(*(pool.post("/", b"%d" % i, timeout_s=5) for i in range(50)))
    assert [b for _, b in outs] == [b"%d" % i for i in range(50)]
    assert srv.connections == 4  # none was idle when the 50 started; 4 at most


async def test_prefix_and_extra_headers_are_sent():
    async with (
        raw_server(echo) as srv,
        Http1Pool(srv.url + "/api/", headers={"Authorization": "Bearer k"}) as pool,
    ):
        await pool.post("/v1/completions", b"{}", timeout_s=5)
    assert srv.seen[0].head.startswith("POST /api/v1/completions HTTP/1.1\r\n")
    assert "\r\nAuthorization: Bearer k\r\n" in srv.seen[0].head


async def test_chunked_response_is_joined():
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    async with raw_server(lambda s: chunked) as srv, Http1Pool(srv.url) as pool:
        assert await pool.post("/", b"{}", timeout_s=5) == (200, b"abcde")
        assert await pool.post("/", b"{}", timeout_s=5) == (200, b"abcde")
    assert srv.connections == 1


async def test_status_is_returned_with_its_body():
    bad = b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy"
    async with raw_server(lambda s: bad) as srv, Http1Pool(srv.url) as pool:
        assert await pool.post("/", b"{}", timeout_s=5) == (503, b"busy")


async def test_connection_close_header_is_obeyed():
    async with (
        raw_server(lambda s: ok(b"x", "Connection: close\r\n")) as srv,
        Http1Pool(srv.url) as pool,
    ):
        for _ in range(3):
            assert await pool.post("/", b"{}", timeout_s=5) == (200, b"x")
    assert srv.connections == 3


async def test_an_idle_connection_the_server_closed_is_not_reused():
    async with raw_server(lambda s: (ok(b"a"), "close")) as srv, Http1Pool(srv.url) as pool:
        assert await pool.post("/", b"1", timeout_s=5) == (200, b"a")
        await asyncio.sleep(0.1)  # the server's close arrives while the connection is idle
        assert await pool.post("/", b"2", timeout_s=5) == (200, b"a")
    assert [(s.conn, s.body) for s in srv.seen] == [(0, b"1"), (1, b"2")]


async def test_a_close_crossing_a_request_on_a_reused_connection_is_resent_once():
    # the server answers, then closes the connection as the next request arrives
    def once(s: Seen) -> bytes | str:
        return ok(b"a") if len(srv.seen) % 2 else "close"

    async with raw_server(lambda s: once(s)) as srv, Http1Pool(srv.url) as pool:
        assert await pool.post("/", b"1", timeout_s=5) == (200, b"a")
        # sent again, once, on a new connection
        assert await pool.post("/", b"2", timeout_s=5) == (200, b"a")
    assert [(s.conn, s.body) for s in srv.seen] == [(0, b"1"), (0, b"2"), (1, b"2")]


async def test_a_new_connection_closed_before_an_answer_is_not_resent():
    async with raw_server(lambda s: "close") as srv, Http1Pool(srv.url) as pool:
        with pytest.raises(RequestFailed, match="connection closed by the server"):
            await pool.post("/", b"{}", timeout_s=5)
    assert len(srv.seen) == 1


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"HTTP/1.1 200 OK\r\n\r\nbody ended by close", "connection closed by the server"),
        (b"hello there\r\n\r\n", "malformed HTTP response"),
    ],
)
async def test_unusable_responses_are_request_failures(raw: bytes, match: str):
    async def closing(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.readuntil(b"\r\n\r\n")
        w.write(raw)
        await w.drain()
        w.close()

    server = await asyncio.start_server(closing, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with Http1Pool(f"http://127.0.0.1:{port}") as pool:
        with pytest.raises(RequestFailed, match=match):
            await pool.post("/", b"", timeout_s=5)
    server.close()


async def test_timeout_drops_the_connection_and_the_next_request_gets_a_new_one():
    def answer(s: Seen) -> bytes | str:
        return "hang" if s.body == b"slow" else ok(b"fast")

    async with raw_server(answer) as srv, Http1Pool(srv.url) as pool:
        with pytest.raises(TimeoutError):
            await pool.post("/", b"slow", timeout_s=0.2)
        assert await pool.post("/", b"quick", timeout_s=5) == (200, b"fast")
    assert srv.connections == 2


async def test_refused_connection_is_connect_failed():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with Http1Pool(f"http://127.0.0.1:{port}") as pool:
        with pytest.raises(ConnectFailed, match="Connection refused"):
            await pool.post("/", b"{}", timeout_s=5)


async def test_connect_timeout_is_connect_failed():
    # a listener that never accepts: once its backlog is full, connects hang
    lsn = socket.socket()
    lsn.bind(("127.0.0.1", 0))
    lsn.listen(0)
    port = lsn.getsockname()[1]
    fillers = []
    for _ in range(4):
        f = socket.socket()
        f.setblocking(False)
        with suppress(BlockingIOError):
            f.connect(("127.0.0.1", port))
        fillers.append(f)
    try:
        async with Http1Pool(f"http://127.0.0.1:{port}", connect_timeout_s=0.3) as pool:
            with pytest.raises(ConnectFailed, match=r"no connection within 0\.3 s"):
                await pool.post("/", b"{}", timeout_s=5)
    finally:
        for f in fillers:
            f.close()
        lsn.close()


async def test_close_fails_in_flight_requests_and_refuses_new_ones():
    async with raw_server(lambda s: "hang") as srv:
        pool = Http1Pool(srv.url)
        req = asyncio.ensure_future(pool.post("/", b"{}", timeout_s=30))
        await srv.arrived.wait()
        await pool.close()
        await pool.close()
        with pytest.raises(RequestFailed):
            await req
        with pytest.raises(ConnectFailed, match="closed"):
            await pool.post("/", b"{}", timeout_s=5)


def test_bad_url_is_refused():
    with pytest.raises(ValueError, match="expected http://host"):
        Http1Pool("ftp://x")
    with pytest.raises(ValueError, match="expected http://host"):
        Http1Pool("127.0.0.1:8000")


@pytest.fixture
def cert_and_key(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_https_with_a_trusted_certificate(cert_and_key: tuple[Path, Path]):
    cert, key = cert_and_key
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    async with raw_server(echo, tls=server_ctx) as srv:
        async with Http1Pool(srv.url) as untrusting:
            with pytest.raises(ConnectFailed, match="CERTIFICATE_VERIFY_FAILED"):
                await untrusting.post("/", b"{}", timeout_s=5)
        trusting = ssl.create_default_context(cafile=str(cert))
        async with Http1Pool(srv.url, ssl_context=trusting) as pool:
            assert await pool.post("/", b'{"a":1}', timeout_s=5) == (200, b'{"a":1}')
