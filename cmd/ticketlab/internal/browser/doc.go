// Package browser holds the lab's real-browser tests: Debian's chromium,
// headless, driven over the DevTools protocol (chromedp) against the
// ticketing binary it is given, as an operator's browser would use it
// (issue 42's web console).
package browser
