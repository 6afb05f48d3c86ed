"""The local SearxNG-compatible search server: real sockets on loopback, SearxNG's JSON shape, BM25."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

import pytest

from surprisegate.errors import InputError
from surprisegate.local.search_server import (
    BM25Index,
    doc_id_from_url,
    doc_url,
    load_corpus,
    main,
    serve,
)

WIRE = Path(__file__).resolve().parents[2] / "shared" / "wire"
REPO = Path(__file__).resolve().parents[1]

CORPUS = [
    {
        "doc_id": "paris",
        "title": "Paris",
        "text": "Paris is the capital and largest city of France. It lies on the Seine.",
    },
    {"doc_id": "berlin", "text": "Berlin is the capital of Germany. It has about 3.8 million inhabitants."},
    {"doc_id": "seine", "text": "The Seine is a river in northern France.", "url": "https://example.org/seine"},
]
# SearxNG's top-level keys and result keys (searx/webutils.py get_json_response; shared/wire/searxng_search.json).
SEARXNG_KEYS = {
    "query",
    "number_of_results",
    "results",
    "answers",
    "corrections",
    "infoboxes",
    "suggestions",
    "unresponsive_engines",
}
SEARXNG_RESULT_KEYS = {
    "url",
    "title",
    "content",
    "engine",
    "template",
    "parsed_url",
    "img_src",
    "thumbnail",
    "priority",
    "engines",
    "positions",
    "score",
    "category",
    "publishedDate",
}


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read()


@pytest.fixture
def server():
    with serve(CORPUS) as running:
        yield running


def search_url(server, **params) -> str:
    return f"{server.url}/search?{urlencode(params)}"


def test_search_answers_in_searxng_json_shape(server):
    status, content_type, body = get(search_url(server, q="capital of France", format="json"))
    assert status == 200 and content_type.startswith("application/json")
    payload = json.loads(body)
    assert set(payload) == SEARXNG_KEYS
    assert payload["query"] == "capital of France"
    first = payload["results"][0]
    assert set(first) == SEARXNG_RESULT_KEYS
    assert doc_id_from_url(first["url"]) == "paris"
    assert first["title"] == "Paris" and first["content"].startswith("Paris is the capital")
    assert first["parsed_url"] == ["https", "corpus.local", "/paris", "", "", ""]
    assert first["positions"] == [1] and first["engines"] == [first["engine"]]
    scores = [result["score"] for result in payload["results"]]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.skipif(not (WIRE / "searxng_search.json").is_file(), reason="shared/wire is not present")
def test_shape_matches_the_wire_sample(server):
    sample = json.loads((WIRE / "searxng_search.json").read_bytes())
    payload = json.loads(get(search_url(server, q="Seine river", format="json"))[2])
    assert set(payload) == set(sample)
    assert set(payload["results"][0]) == set(sample["results"][0])
    for key, value in sample["results"][0].items():
        assert type(payload["results"][0][key]) in (type(value), type(None)), key


def test_given_url_and_derived_title(server):
    payload = json.loads(get(search_url(server, q="river Seine", format="json"))[2])
    urls = [result["url"] for result in payload["results"]]
    assert urls[0] == "https://example.org/seine"
    berlin = json.loads(get(search_url(server, q="Germany", format="json"))[2])["results"][0]
    assert berlin["title"].startswith("Berlin is the capital")  # no title given: the text's first words


@pytest.mark.parametrize(
    "params", [{"q": "France"}, {"q": "France", "format": "html"}, {"q": "France", "format": "rss"}]
)
def test_formats_other_than_json_are_forbidden(server, params):
    status, _, _ = get(search_url(server, **params))
    assert status == 403


def test_healthz_and_unknown_paths(server):
    assert get(f"{server.url}/healthz")[::2] == (200, b"OK")
    assert get(f"{server.url}/nothing")[0] == 404


def test_empty_query_and_bad_page(server):
    status, _, body = get(search_url(server, q="  ", format="json"))
    assert status == 400 and "q parameter" in json.loads(body)["error"]
    assert get(search_url(server, q="France", format="json", pageno="two"))[0] == 400


def test_no_match_and_paging(server):
    payload = json.loads(get(search_url(server, q="zzzqqq", format="json"))[2])
    assert payload["results"] == [] and payload["number_of_results"] == 0
    page_two = json.loads(get(search_url(server, q="capital", format="json", pageno=2))[2])
    assert page_two["results"] == []


def test_post_form_like_searxng(server):
    request = urllib.request.Request(
        f"{server.url}/search", data=urlencode({"q": "Berlin", "format": "json"}).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert doc_id_from_url(json.loads(response.read())["results"][0]["url"]) == "berlin"


def test_request_counter(server):
    before = server.requests_served
    get(f"{server.url}/healthz")
    assert server.requests_served == before + 1


def test_doc_url_round_trips_odd_ids():
    for doc_id in ["web-c1d231154a4d", "a/b c", "é#?"]:
        assert doc_id_from_url(doc_url(doc_id)) == doc_id
    assert doc_id_from_url("https://en.wikipedia.org/wiki/Paris") is None


def test_bm25_prefers_the_rarer_term():
    index = BM25Index(load_corpus(CORPUS))
    assert index.search("Seine river")[0][0].doc_id == "seine"
    assert index.search("the of and") == []  # stopwords only


def test_corpus_errors_name_the_line(tmp_path):
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"doc_id": "a", "text": "x"}\n{oops\n')
    with pytest.raises(InputError, match=r"bad.jsonl:2: not JSON"):
        load_corpus(bad_json)
    with pytest.raises(InputError, match="line 2: needs a non-empty 'doc_id'"):
        load_corpus([{"doc_id": "a", "text": "x"}, {"text": "y"}])
    with pytest.raises(InputError, match="doc_id='a' appears twice"):
        load_corpus([{"doc_id": "a", "text": "x"}, {"doc_id": "a", "text": "y"}])
    with pytest.raises(InputError, match="is not a file"):
        load_corpus(tmp_path / "missing.jsonl")
    with pytest.raises(InputError, match="empty"):
        load_corpus([])


def test_main_reports_a_bad_corpus(tmp_path, capsys):
    assert main(["--corpus", str(tmp_path / "missing.jsonl")]) == 2
    assert "is not a file" in capsys.readouterr().err


def test_main_serves_until_stopped(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in CORPUS))
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    process = subprocess.Popen(
        [sys.executable, "-m", "surprisegate.local.search_server", "--corpus", str(corpus), "--port", "0", "--quiet"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = process.stderr.readline()  # "serving 3 documents at http://127.0.0.1:PORT/search?..."
        assert "serving 3 documents" in line, line
        base = line.split(" at ")[1].split("/search")[0]
        payload = json.loads(get(f"{base}/search?q=Paris&format=json")[2])
        assert doc_id_from_url(payload["results"][0]["url"]) == "paris"
    finally:
        process.terminate()
        process.wait(timeout=5)


def test_halueval_evidence_in_top3(shared_data):
    """The server must rank each halueval question's evidence document in its top 3 for >= 90% of them."""
    questions = [json.loads(line) for line in (shared_data / "halueval_qa_dev.jsonl").open(encoding="utf-8")]
    corpus = shared_data / "web_corpus.jsonl"
    gold_by_text = {doc.text.strip(): doc.doc_id for doc in load_corpus(corpus)}
    hits = ranks_missing = 0
    started = time.monotonic()
    with serve(corpus) as running:
        for row in questions:
            gold = gold_by_text.get(row["evidence"].strip())
            if gold is None:  # every dev row's evidence is one corpus document, verbatim
                ranks_missing += 1
                continue
            payload = json.loads(get(search_url(running, q=row["question"], format="json"))[2])
            top3 = [doc_id_from_url(result["url"]) for result in payload["results"][:3]]
            hits += gold in top3
    share = hits / len(questions)
    print(f"halueval top-3: {hits}/{len(questions)} = {share:.3f} ({time.monotonic() - started:.1f} s)")
    assert ranks_missing == 0
    assert share >= 0.90
