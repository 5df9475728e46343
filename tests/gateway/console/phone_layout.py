"""What "works at 390 px" means, measured in the browser: no sideways scroll, no clipped text."""

from __future__ import annotations

from playwright.async_api import Page, ViewportSize

PHONE: ViewportSize = {"width": 390, "height": 844}

_MEASURE = """() => {
  const width = window.innerWidth;
  const problems = [];
  const classes = (el) =>
    typeof el.className === "string" && el.className.trim()
      ? "." + el.className.trim().split(/\\s+/).join(".")
      : "";
  const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + classes(el);
  for (const el of document.querySelectorAll("body *")) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 && box.height === 0) continue;  // not rendered
    if (el.closest("svg, canvas")) continue;  // drawings have no text to clip
    const style = getComputedStyle(el);
    const text = (el.value || el.placeholder || el.textContent || "").trim().slice(0, 50);
    const hides = ["hidden", "clip"].includes(style.overflowX) || style.textOverflow === "ellipsis";
    if (hides && text && el.scrollWidth > el.clientWidth + 1) {
      problems.push(`${name(el)} clips its text (${el.scrollWidth} > ${el.clientWidth}): ${text}`);
    }
    if (box.right > width + 1 && !el.closest("[data-scrolls]")) {
      problems.push(`${name(el)} reaches past the screen (${Math.round(box.right)} px): ${text}`);
    }
  }
  return {scrollWidth: document.documentElement.scrollWidth, problems: problems};
}"""


async def layout_problems(page: Page) -> list[str]:
    """Why the page does not fit the viewport's width: sideways scroll, clipped or cut text."""
    measured = await page.evaluate(_MEASURE)
    problems = [str(problem) for problem in measured["problems"]]
    width = PHONE["width"]
    if measured["scrollWidth"] > width:
        problems.insert(0, f"the page scrolls sideways: {measured['scrollWidth']} > {width}")
    return problems
