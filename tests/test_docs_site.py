"""The built docs site renders offline in a real browser.

`make docs` builds ``site/`` (``mkdocs build --strict``); these tests serve it on 127.0.0.1 and open
every page in headless Chromium (Debian's package, driven by Playwright) with every other host made
unreachable, and check what a reader would see:

* no uncaught page error and no console error (a formula KaTeX cannot parse is reported as an
  uncaught error by ``docs/javascripts/katex-init.js``; a missing asset is a console error);
* no request for anything but 127.0.0.1;
* every formula rendered: each ``.arithmatex`` element holds KaTeX output, and no raw TeX
  (``\\(``, ``\\[``, ``$$``, ``$...$``, ``\\macro``) is left in the text outside code, in the
  article or in the navigation (where headings with math reappear);
* every mermaid diagram rendered: no ``pre.mermaid`` left, and each diagram's SVG has non-zero size.
  Material draws diagrams into a *closed* shadow root, so an init script forces shadow roots open
  before any page script runs;
* every image of the article loaded (the validation report's figures).

The search box finds English and Chinese terms (jieba segments the Chinese at build time).

Two negative tests feed the same checks a page with a broken formula and one with a broken diagram
and require that both are caught. Screenshots of the overview, the inference page and one API page
go to ``artifacts/docs-screenshots/`` (git-ignored) with ``summary.json`` (pages, formula and
diagram counts).
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from wall_clock import budget

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "site"
ARTIFACTS = ROOT / "artifacts" / "docs-screenshots"
SCREENSHOTS = {"overview": "", "inference": "inference/", "api-cauchy": "api/cauchy/"}
LOCAL_HOST = "127.0.0.1"

CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    # Second line of defence behind the request router: no name but 127.0.0.1 resolves.
    f"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE {LOCAL_HOST}",
]

# Runs before any page script: Material renders mermaid into closed shadow roots; open them so the
# test can see the SVG.
OPEN_SHADOW_ROOTS = """
const attachShadow = Element.prototype.attachShadow;
Element.prototype.attachShadow = function (init) {
  return attachShadow.call(this, Object.assign({}, init, { mode: "open" }));
};
"""

# Settled when every formula holds KaTeX output (or was marked as failed) and no mermaid block is
# waiting to be drawn.
RENDERING_SETTLED = """
() => {
  const formulas = [...document.querySelectorAll(".arithmatex")];
  const mathDone = formulas.every(el => el.querySelector(".katex") || el.dataset.katexError);
  const hosts = [...document.querySelectorAll("div.mermaid")];
  const diagramsDone = document.querySelectorAll("pre.mermaid").length === 0
    && hosts.every(el => el.shadowRoot && el.shadowRoot.querySelector("svg"));
  return mathDone && diagramsDone;
}
"""

# What the page shows: formulas, diagrams and any raw TeX left in its text outside code.
INSPECT_PAGE = r"""
() => {
  const formulas = [...document.querySelectorAll(".arithmatex")];
  const unrendered = formulas
    .filter(el => !el.querySelector(".katex") || el.dataset.katexError)
    .map(el => el.dataset.katexError || el.textContent.slice(0, 80));
  const diagrams = [...document.querySelectorAll("div.mermaid")].map(el => {
    const svg = el.shadowRoot && el.shadowRoot.querySelector("svg");
    if (!svg) return { ok: false, why: "no svg in the shadow root" };
    const box = svg.getBoundingClientRect();
    const error = svg.getAttribute("aria-roledescription") === "error"
      || svg.querySelector(".error-icon") !== null;
    return { ok: box.width > 0 && box.height > 0 && !error, width: box.width, height: box.height,
             why: error ? "mermaid drew its syntax-error image" : "zero size" };
  });
  // the whole page: the article, and the navigation where headings with math reappear
  const copy = document.body.cloneNode(true);
  copy.querySelectorAll("pre, code, .katex, .arithmatex, script, style, .doc-signature")
    .forEach(el => el.remove());
  const text = copy.textContent;
  const patterns = [/\\\(/, /\\\)/, /\\\[/, /\\\]/, /\$\$/, /\$[^$\s][^$]*\$/, /\\[a-zA-Z]{2,}\b/];
  const rawTex = patterns.map(p => text.match(p)).filter(m => m).map(m => m[0].slice(0, 60));
  // a control character anywhere, formulas' sources included (a "\v" typed into a Python string
  // becomes a vertical tab, and KaTeX draws it as a box)
  const sources = formulas.map(el => [el.querySelector("annotation")?.textContent, el.dataset.katexError,
                                       el.textContent].join(" ")).join(" ");
  const controls = (document.body.textContent + sources).match(/[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]/g) || [];
  const controlCharacters = [...new Set(controls)].map(c => "U+" + c.charCodeAt(0).toString(16).padStart(4, "0"));
  const brokenImages = [...document.querySelectorAll("article img")]
    .filter(img => !img.complete || img.naturalWidth === 0)
    .map(img => img.getAttribute("src"));
  // formulas against the content column: a display formula wider than its box (after katex-init.js drew it
  // smaller, down to its floor) and whether that box scrolls with the hidden edge marked; any formula whose right
  // edge passes the column's without a box that scrolls it into view (cut)
  const annotation = el => (el.querySelector("annotation")?.textContent || "").trim().slice(0, 60);
  const wideFormulas = [...document.querySelectorAll("article div.arithmatex")]
    .filter(el => el.scrollWidth > el.clientWidth + 1)
    .map(el => ({ tex: annotation(el), over: el.scrollWidth - el.clientWidth,
                  scale: parseFloat(el.querySelector(".katex-display .katex")?.dataset.scale || "1"),
                  scrolls: ["auto", "scroll"].includes(getComputedStyle(el).overflowX),
                  marked: getComputedStyle(el).backgroundImage.includes("gradient") }));
  const article = document.querySelector("article");
  const columnRight = article ? article.getBoundingClientRect().right : Infinity;
  const scrolled = el => {
    for (let box = el.parentElement; box && box !== article; box = box.parentElement) {
      if (["auto", "scroll"].includes(getComputedStyle(box).overflowX)) return true;
    }
    return false;
  };
  const cutFormulas = [...document.querySelectorAll("article .katex")]
    .filter(el => el.getBoundingClientRect().right > columnRight + 1 && !scrolled(el))
    .map(el => annotation(el));
  return {
    wideFormulas,
    cutFormulas,
    formulas: formulas.length,
    images: document.querySelectorAll("article img").length,
    brokenImages,
    unrendered,
    diagrams,
    preMermaid: document.querySelectorAll("pre.mermaid").length,
    rawTex,
    controlCharacters,
  };
}
"""


def _chromium() -> str:
    path = os.environ.get("CAUSALQWEN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail(
            "the docs browser test needs Debian's chromium (`apt-get install chromium`; `make test` "
            "and .ci/run install it), or CAUSALQWEN_CHROMIUM=/path/to/chrome"
        )
    return path


def _site_pages(site: Path) -> list[str]:
    """Every HTML page of the site, as a path relative to its root ('' is the overview)."""
    pages = []
    for html in sorted(site.rglob("index.html")):
        relative = html.parent.relative_to(site).as_posix()
        if relative.startswith("assets"):
            continue
        pages.append("" if relative == "." else relative + "/")
    return pages


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - signature fixed by the base class
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # the browser closing a connection early (a cancelled prefetch) is not a test failure


@pytest.fixture(scope="module")
def site_url():
    if not (SITE / "index.html").exists():
        pytest.fail(f"{SITE} has no built site: run `make docs` first (`make test` does)")
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    server = _QuietServer((LOCAL_HOST, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://{LOCAL_HOST}:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is a dev dependency")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Visit:
    """One browser context with the network closed except for 127.0.0.1, recording what happens."""

    def __init__(self, browser):
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.context.add_init_script(OPEN_SHADOW_ROOTS)
        self.blocked: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.set_default_timeout(budget(30) * 1000)  # Playwright's own 30 s, scaled to the machine's load
        self.errors: list[str] = []
        self.page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))
        self.page.on(
            "console",
            lambda message: (
                self.errors.append(f"console {message.type}: {message.text}") if message.type == "error" else None
            ),
        )

    def _route(self, route):
        url = route.request.url
        if urlparse(url).hostname == LOCAL_HOST or not url.startswith(("http:", "https:", "ws:", "wss:")):
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort("addressunreachable")

    def open(self, url: str, settle_seconds: int = 20) -> dict:
        """Load ``url``, wait (at most ``settle_seconds``) for math and diagrams to settle, and return what the page
        shows."""
        self.errors.clear()
        self.page.goto(url, wait_until="load")
        try:
            self.page.wait_for_function(RENDERING_SETTLED, timeout=budget(settle_seconds) * 1000)
        except Exception as error:  # a diagram or formula that never renders is reported below
            self.errors.append(f"rendering did not settle within {settle_seconds} s: {type(error).__name__}")
        self.page.wait_for_timeout(50)  # let a deferred KaTeX error surface as a page error
        report = self.page.evaluate(INSPECT_PAGE)
        report["errors"] = list(self.errors)
        return report

    def close(self):
        self.context.close()


def _problems(report: dict) -> list[str]:
    problems = list(report["errors"])
    problems += [f"formula not rendered: {item}" for item in report["unrendered"]]
    problems += [f"raw TeX left in the text: {item!r}" for item in report["rawTex"]]
    problems += [f"control character {item} in the text" for item in report["controlCharacters"]]
    if report["preMermaid"]:
        problems.append(f"{report['preMermaid']} pre.mermaid block(s) left unrendered")
    problems += [f"diagram not rendered: {d['why']}" for d in report["diagrams"] if not d["ok"]]
    problems += [f"image not loaded: {src}" for src in report["brokenImages"]]
    problems += [f"formula cut at the column's edge: {tex}" for tex in report["cutFormulas"]]
    problems += [
        f"display formula {wide['over']} px wider than the column at scale {wide['scale']}: {wide['tex']}"
        for wide in report["wideFormulas"]
    ]
    return problems


def test_every_page_renders_offline(site_url, browser):
    pages = _site_pages(SITE)
    expected = {"", "inference/", "losses/", "api/cauchy/", "glossary/", "decisions/", "validation/"}
    assert expected <= set(pages), f"pages missing from the site: {sorted(expected - set(pages))}"

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    visit = Visit(browser)
    failures, summary = {}, {}
    try:
        for page in pages:
            report = visit.open(site_url + page)
            problems = _problems(report)
            if problems:
                failures[page or "/"] = problems
            summary[page or "/"] = {
                "formulas": report["formulas"],
                "diagrams": len(report["diagrams"]),
                "images": report["images"],
            }
            for name, target in SCREENSHOTS.items():
                if page == target:
                    visit.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    finally:
        blocked = list(visit.blocked)
        visit.close()

    totals = {
        "pages": len(pages),
        "formulas": sum(p["formulas"] for p in summary.values()),
        "diagrams": sum(p["diagrams"] for p in summary.values()),
        "images": sum(p["images"] for p in summary.values()),
    }
    (ARTIFACTS / "summary.json").write_text(json.dumps({"totals": totals, "pages": summary}, indent=1))

    assert not failures, json.dumps(failures, indent=1, ensure_ascii=False)
    assert not blocked, f"requests tried to leave the machine: {blocked}"
    # The spec pages carry the diagrams the issue asks for: data flow, the five modes, the losses.
    for page in ("/", "inference/", "losses/"):
        assert summary[page]["diagrams"] >= 1, f"{page} has no rendered mermaid diagram"
    assert summary["api/cauchy/"]["formulas"] >= 10, "the Cauchy API page lost its docstring formulas"
    assert summary["validation/"]["images"] >= 8, "the validation report lost its figures"
    for name in SCREENSHOTS:
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000


def _served_with(visit: Visit, site_url: str, insert_html: str, settle_seconds: int = 20) -> dict:
    """Open a page that is the overview with ``insert_html`` added to its article."""
    html = (SITE / "index.html").read_text(encoding="utf-8")
    marker = '<article class="md-content__inner md-typeset">'
    assert marker in html, "Material's article marker changed; update the negative tests"
    broken = html.replace(marker, marker + insert_html, 1)
    # The overview's relative asset links must resolve from the site root, not from __broken__/.
    broken = broken.replace("<head>", f'<head><base href="{site_url}">', 1)
    url = site_url + "__broken__/"
    visit.context.route(url, lambda route: route.fulfill(status=200, content_type="text/html", body=broken))
    return visit.open(url, settle_seconds)


def test_a_formula_wider_than_a_narrow_column_scrolls_with_its_hidden_edge_marked(site_url, browser):
    """At 600 px the Cauchy API page's longest formulas do not fit even at the smallest scale katex-init.js draws
    them at: each scrolls sideways in its own box, with the edge that hides the rest marked, and none is cut. (At
    1280 px every formula of the site fits its column: `test_every_page_renders_offline`.)"""
    visit = Visit(browser)
    try:
        visit.page.set_viewport_size({"width": 600, "height": 900})
        report = visit.open(site_url + "api/cauchy/")
    finally:
        visit.close()
    wide = report["wideFormulas"]
    assert wide, "no formula is wider than a 600 px column: test a narrower one"
    assert all(item["scrolls"] and item["marked"] and item["scale"] == 0.75 for item in wide), wide
    assert report["cutFormulas"] == [] and report["errors"] == [], report


def test_broken_formula_is_caught(site_url, browser):
    visit = Visit(browser)
    try:
        report = _served_with(visit, site_url, r'<p><span class="arithmatex">\(\frac{1}{\)</span></p>')
    finally:
        visit.close()
    problems = _problems(report)
    assert any("KaTeX could not render" in p for p in problems), problems
    assert any("formula not rendered" in p for p in problems), problems


def test_a_control_character_in_a_formula_is_caught(site_url, browser):
    visit = Visit(browser)
    try:  # what "$\varepsilon$" becomes when a Python string without r"" turns "\v" into a vertical tab
        report = _served_with(visit, site_url, '<p><span class="arithmatex">\\(\x0barepsilon\\)</span></p>')
    finally:
        visit.close()
    problems = _problems(report)
    assert any("control character U+000b" in p for p in problems), problems


def test_broken_diagram_is_caught(site_url, browser):
    visit = Visit(browser)
    try:
        # a diagram mermaid cannot parse is never drawn: the page never settles, so 3 s say as much as 20
        report = _served_with(
            visit, site_url, '<pre class="mermaid"><code>flowchart LR\n  A --&gt; [</code></pre>', settle_seconds=3
        )
    finally:
        visit.close()
    problems = _problems(report)
    assert any(p.startswith("page error: Parse error on line 2") for p in problems), problems
    assert "1 pre.mermaid block(s) left unrendered" in problems, problems


@pytest.mark.parametrize(
    "query, expected_page", [("abduction", "abduction/"), ("柯西", "glossary/"), ("外生噪声", "action/")]
)
def test_search_serves_english_and_chinese(site_url, browser, query, expected_page):
    """The built-in search (lunr, with jieba's segmentation of the Chinese at build time) finds both."""
    visit = Visit(browser)
    try:
        visit.open(site_url)
        visit.page.locator("label.md-search__icon, .md-search__input").first.click()
        box = visit.page.locator("input.md-search__input")
        # Material searches on key events (a CJK string arrives as text input, so a key press follows
        # it), and the index is built in a web worker: a query entered before it is ready is entered
        # again until results appear or 60 s pass.
        deadline = time.monotonic() + budget(60)
        while True:
            box.fill(query)
            box.press("End")
            try:
                visit.page.wait_for_selector(".md-search-result__item", timeout=budget(3) * 1000)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
        links = visit.page.eval_on_selector_all(".md-search-result__item a", "links => links.map(a => a.href)")
        errors, blocked = list(visit.errors), list(visit.blocked)
    finally:
        visit.close()
    assert any(urlparse(link).path.endswith("/" + expected_page) for link in links), (query, links)
    assert not errors and not blocked, (errors, blocked)
