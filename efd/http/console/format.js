// How the API's times and figures read on the page; "—" where there is none.

export function time(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  return date.toLocaleTimeString([], { hour12: false }) + "." +
    String(date.getMilliseconds()).padStart(3, "0");
}

export function when(iso) {
  return iso ? new Date(iso).toLocaleString([], { hour12: false }) : "—";
}

export function percent(rate) {
  return rate === null ? "—" : (rate * 100).toFixed(1) + " %";
}

export function ms(value) {
  return value === null ? "—" : value.toFixed(1) + " ms";
}
