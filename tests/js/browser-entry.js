// The page's copy of analytics.js, as an application bundles it from npm
// (tests/test_browser.py builds it with esbuild into build/).
import { AnalyticsBrowser } from '@segment/analytics-next'

window.AnalyticsBrowser = AnalyticsBrowser
