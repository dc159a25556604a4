// How a receiver on WHATWG's URL and URLSearchParams reads the requests efd renders for
// actions, for tests/integration/test_action_requests_compat.py, which sends JSON on stdin:
// {"forms": [object, ...], "urls": [text, ...]}. Prints one JSON object: "forms", each
// object serialized as URLSearchParams does (a string as it is, null as "", any other value
// as JSON.stringify writes it, a lone surrogate as U+FFFD as in efd's JSON bodies), and
// "urls", each URL as a receiver reads it: its protocol, host, decoded path segments and
// query pairs.
import { readFileSync } from 'node:fs'

const { forms, urls } = JSON.parse(readFileSync(0, 'utf8'))
const wellFormed = (value) =>
  typeof value === 'string'
    ? value.toWellFormed()
    : Array.isArray(value)
      ? value.map(wellFormed)
      : value !== null && typeof value === 'object'
        ? Object.fromEntries(
            Object.entries(value).map(([key, item]) => [key.toWellFormed(), wellFormed(item)])
          )
        : value
const text = (value) =>
  value === null ? '' : typeof value === 'string' ? value : JSON.stringify(wellFormed(value))
const out = {
  forms: forms.map((object) =>
    new URLSearchParams(Object.entries(object).map(([key, value]) => [key, text(value)])).toString()
  ),
  urls: urls.map((href) => {
    const url = new URL(href)
    return {
      protocol: url.protocol,
      host: url.host,
      username: url.username,
      segments: url.pathname.split('/').map((segment) => decodeURIComponent(segment)),
      query: [...url.searchParams],
    }
  }),
}
process.stdout.write(JSON.stringify(out))
