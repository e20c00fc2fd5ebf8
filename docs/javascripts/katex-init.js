// Render every formula that pymdownx.arithmatex (generic mode) marked: inline math arrives as
// <span class="arithmatex">\(...\)</span>, display math as <div class="arithmatex">\[...\]</div>.
// Headings with math also reach the navigation (the table of contents) as plain text "\(...\)";
// those inline pieces are rendered too. KaTeX runs with throwOnError, and any formula that fails to
// parse is reported as an uncaught error naming the formula, after all others are rendered, so a
// broken formula is never silent.
const INLINE_MATH = /\\\((.+?)\\\)/g;

function renderNavigationMath(root, failures) {
  for (const link of root.querySelectorAll(".md-nav__link")) {
    const walker = document.createTreeWalker(link, NodeFilter.SHOW_TEXT);
    const textNodes = [];
    while (walker.nextNode()) {
      if (walker.currentNode.nodeValue.includes("\\(")) textNodes.push(walker.currentNode);
    }
    for (const node of textNodes) {
      const fragment = document.createDocumentFragment();
      let last = 0;
      for (const match of node.nodeValue.matchAll(INLINE_MATH)) {
        fragment.append(node.nodeValue.slice(last, match.index));
        const span = document.createElement("span");
        try {
          katex.render(match[1], span, { displayMode: false, throwOnError: true });
        } catch (error) {
          failures.push(`${error.message} in: ${match[1]}`);
          span.textContent = match[0];
        }
        fragment.append(span);
        last = match.index + match[0].length;
      }
      fragment.append(node.nodeValue.slice(last));
      node.replaceWith(fragment);
    }
  }
}

// A display formula wider than the content column is drawn smaller until it fits, down to MIN_FORMULA_SCALE of
// its size; one wider still stays at that scale and scrolls sideways (extra.css marks the edges it hides).
// Fitted again once the fonts have loaded (the widths are the browser's), and when the window's width changes.
const MIN_FORMULA_SCALE = 0.75;

function fitDisplayFormulas(root) {
  for (const element of root.querySelectorAll("div.arithmatex")) {
    const box = element.querySelector(".katex-display");
    const formula = box && box.querySelector(".katex");
    if (!formula) continue;
    formula.style.fontSize = "";
    const style = getComputedStyle(box);
    const padding = parseFloat(style.paddingLeft) + parseFloat(style.paddingRight);
    const needed = element.scrollWidth - padding;
    const available = element.clientWidth - padding;
    if (needed <= available + 1) continue;
    const scale = Math.max(MIN_FORMULA_SCALE, available / needed);
    formula.style.fontSize = `${parseFloat(getComputedStyle(formula).fontSize) * scale}px`;
    formula.dataset.scale = scale.toFixed(3);
  }
}

let fitRequested = false;
document.fonts.ready.then(() => fitDisplayFormulas(document.body));
window.addEventListener("resize", () => {
  if (fitRequested) return;
  fitRequested = true;
  requestAnimationFrame(() => {
    fitRequested = false;
    fitDisplayFormulas(document.body);
  });
});

document$.subscribe(({ body }) => {
  const failures = [];
  for (const element of body.querySelectorAll(".arithmatex")) {
    const source = element.textContent.trim();
    const display = source.startsWith("\\[");
    const tex = source.slice(2, -2);
    try {
      katex.render(tex, element, { displayMode: display, throwOnError: true });
    } catch (error) {
      element.dataset.katexError = error.message;
      failures.push(`${error.message} in: ${tex}`);
    }
  }
  renderNavigationMath(body, failures);
  fitDisplayFormulas(body);
  if (failures.length > 0) {
    throw new Error(`KaTeX could not render ${failures.length} formula(s): ${failures.join(" | ")}`);
  }
});
