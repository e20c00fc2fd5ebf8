// Render every formula that pymdownx.arithmatex (generic mode) marked: inline math arrives as
// <span class="arithmatex">\(...\)</span>, display math as <div class="arithmatex">\[...\]</div>.
// KaTeX runs with throwOnError, and any formula that fails to parse is reported as an uncaught
// error naming the formula, after all others are rendered, so a broken formula is never silent.
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
  if (failures.length > 0) {
    throw new Error(`KaTeX could not render ${failures.length} formula(s): ${failures.join(" | ")}`);
  }
});
