"""Who may call the server (toolkit/serve/auth.py): with --api-key every path but the probes needs a bearer key (any
of several, or as the anthropic client's x-api-key; a wrong or missing one is OpenAI's 401, which the openai client
raises as AuthenticationError, and Anthropic's on /v1/messages); with --allowed-origins browsers on those origins get CORS headers and preflights pass without a key; HTTPS with
--ssl-keyfile / --ssl-certfile; bad flags are refused before loading."""
import shutil
import ssl
import subprocess

import pytest
from fastapi.testclient import TestClient

from toolkit.cli import main
from toolkit.serve.auth import ApiKeys, guarded

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
GUARDED = [("GET", "/v1/models", None), ("POST", "/v1/chat/completions", CHAT),
           ("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
           ("POST", "/v1/responses", {"input": "Hi", "max_output_tokens": 2}),
           ("POST", "/tokenize", {"prompt": "Hi"}), ("GET", "/v1/made-up", None)]


@pytest.fixture(scope="module")
def asgi(tiny_target, in_process_app):
    with in_process_app(tiny_target) as (app, _):
        yield app


@pytest.mark.parametrize("method, path, body", GUARDED)
def test_every_path_but_the_probes_needs_a_key(asgi, method, path, body):
    with TestClient(guarded(asgi, ["sk-one", "sk-two"])) as c:
        for headers in ({}, {"Authorization": "Bearer sk-three"}, {"Authorization": "Basic sk-one"},
                        {"Authorization": "Bearer "}, {"Authorization": "sk-one"}):
            r = c.request(method, path, json=body, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (headers, r.text)
            assert r.json()["error"]["code"] == "invalid_api_key"
        for key in ("sk-one", "sk-two"):  # any of the keys; past the check, the path answers as it would
            r = c.request(method, path, json=body, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == (404 if path == "/v1/made-up" else 200), r.text


def test_the_anthropic_clients_x_api_key_header_is_a_key_too(asgi):
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    with TestClient(guarded(asgi, ["sk-one"])) as c:
        for headers in ({}, {"x-api-key": "sk-two"}, {"x-api-key": ""}, {"Authorization": "Bearer sk-two",
                                                                         "x-api-key": "sk-one"}):
            r = c.post("/v1/messages", json=body, headers=headers)  # refused in Anthropic's error shape there
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", (headers, r.text)
        assert c.post("/v1/messages", json=body, headers={"x-api-key": "sk-one"}).status_code == 200
        assert c.get("/v1/models", headers={"x-api-key": "sk-one"}).status_code == 200
        assert c.get("/v1/models", headers={"x-api-key": "sk-two"}).json()["error"]["code"] == "invalid_api_key"


def test_probes_stay_open(asgi):
    with TestClient(guarded(asgi, ["sk-one"])) as c:
        for path in ("/health", "/ping", "/version", "/metrics"):
            assert c.get(path).status_code == 200, path


def test_allowed_origins_get_cors_and_their_preflight_needs_no_key(asgi):
    origin, other = "http://ui.example:3000", "http://elsewhere.example"
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    with TestClient(guarded(asgi, ["sk-one"], [origin])) as c:
        r = c.options("/v1/chat/completions", headers={"Origin": origin, **preflight})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
        assert c.options("/v1/chat/completions", headers={"Origin": other, **preflight}).status_code == 400
        r = c.get("/v1/models", headers={"Origin": origin, "Authorization": "Bearer sk-one"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
        r = c.get("/v1/models", headers={"Origin": origin})  # the 401 carries CORS too: the page can read it
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == origin
    with TestClient(guarded(asgi)) as c:  # neither flag: the app as it was, no CORS headers
        r = c.get("/v1/models", headers={"Origin": origin})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_empty_keys_are_refused():
    with pytest.raises(ValueError, match="non-empty"):
        ApiKeys(None, [""])
    with pytest.raises(ValueError, match="non-empty"):
        ApiKeys(None, [])


@pytest.mark.parametrize("extra, message", [
    (["--api-key", " "], "--api-key: a key is empty"),
    (["--ssl-keyfile", "key.pem"], "--ssl-keyfile and --ssl-certfile go together"),
    (["--ssl-keyfile", "nowhere.pem", "--ssl-certfile", "nowhere.pem"], "--ssl-keyfile nowhere.pem: no such file"),
    (["--allowed-origins", "http://localhost:3000", "not a url"], "--allowed-origins 'not a url': give origins as a "
                                                                  "browser sends them"),
    (["--allowed-origins", "https://app.example.com/path"], "scheme://host[:port]")])
def test_bad_flags_are_refused_before_loading(capsys, extra, message):
    assert main(["serve", "--draft", "nowhere", "--port", "0", *extra]) == 2
    assert message in capsys.readouterr().err


def test_files_that_are_not_a_pem_certificate_and_key_are_refused_before_loading(tmp_path, capsys):
    (tmp_path / "key.pem").write_text("not a key\n")
    (tmp_path / "cert.pem").write_text("not a certificate\n")
    assert main(["serve", "--draft", "nowhere", "--port", "0", "--ssl-keyfile", str(tmp_path / "key.pem"),
                 "--ssl-certfile", str(tmp_path / "cert.pem")]) == 2
    assert "not a PEM certificate chain and its private key" in capsys.readouterr().err


def test_the_real_server_takes_its_keys_from_the_flag_and_the_environment(tiny_target, serve, monkeypatch):
    """The CLI's server: the openai client with a wrong key gets AuthenticationError, with a right one its answer;
    the 401s are counted in /metrics; $TOOLKIT_API_KEY stands in for the flag."""
    import httpx
    from openai import AuthenticationError, OpenAI

    with serve("--model", str(tiny_target), "--no-speculation", "--api-key", "sk-a", "sk-b") as (base, _):
        with pytest.raises(AuthenticationError):
            OpenAI(base_url=f"{base}/v1", api_key="sk-wrong").models.list()
        good = OpenAI(base_url=f"{base}/v1", api_key="sk-b")
        r = good.chat.completions.create(model=good.models.list().data[0].id, max_tokens=3, temperature=0,
                                         messages=[{"role": "user", "content": "Hi"}])
        assert r.usage.completion_tokens == 3
        assert 'code="401",endpoint="/v1/models"' in httpx.get(f"{base}/metrics").text
    monkeypatch.setenv("TOOLKIT_API_KEY", "sk-env")
    with serve("--model", str(tiny_target), "--no-speculation") as (base, _):
        assert httpx.get(f"{base}/v1/models").status_code == 401
        assert httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer sk-env"}).status_code == 200


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_https_with_a_certificate(tiny_target, serve, tmp_path, monkeypatch):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the readiness probe's and this test's httpx trust it
    import httpx

    with serve("--model", str(tiny_target), "--no-speculation", "--ssl-keyfile", str(key), "--ssl-certfile",
               str(cert)) as (base, _):
        assert base.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=str(cert))
        assert httpx.get(f"{base}/v1/models", verify=trusted).json()["data"][0]["object"] == "model"
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port is not served
            httpx.get(base.replace("https://", "http://") + "/v1/models")
