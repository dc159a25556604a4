// A destination's delivered and failed deliveries per minute (GET /admin/rates) as a small
// inline SVG: one stacked bar per minute, delivered below, failed above.

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 240;
const HEIGHT = 40;

function node(tag, attrs) {
  const made = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) made.setAttribute(key, String(value));
  return made;
}

export function rateChart(name, series) {
  const minutes = series.delivered.length;
  const most = Math.max(1, ...series.delivered.map((d, i) => d + series.failed[i]));
  const step = WIDTH / Math.max(1, minutes);
  const svg = node("svg", {
    class: "rates",
    width: WIDTH,
    height: HEIGHT,
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    role: "img",
    "aria-label": `${name}: delivered and failed per minute`,
  });
  const title = node("title", {});
  const delivered = series.delivered.reduce((a, b) => a + b, 0);
  const failed = series.failed.reduce((a, b) => a + b, 0);
  title.textContent = `last ${minutes} min: ${delivered} delivered, ${failed} failed`;
  svg.append(title);
  for (let i = 0; i < minutes; i += 1) {
    const ok = (series.delivered[i] / most) * HEIGHT;
    const bad = (series.failed[i] / most) * HEIGHT;
    svg.append(
      node("rect", { class: "delivered", x: i * step, y: HEIGHT - ok, width: step * 0.8, height: ok }),
      node("rect", { class: "failed", x: i * step, y: HEIGHT - ok - bad, width: step * 0.8, height: bad }),
    );
  }
  return svg;
}
