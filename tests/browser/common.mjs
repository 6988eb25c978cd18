// What the browser scripts share: failing with one line, and Debian's
// Chromium launched headless the same way for each.
import { chromium } from "playwright-core";

export const fail = (msg) => { console.error("FAIL: " + msg); process.exit(1); };
export const check = (cond, msg) => { if (!cond) fail(msg); };
// How long a wait without a bound of its own lasts. These scripts run beside
// other tests on a 2-core machine, where a page's next refresh can wait
// seconds on a busy database (CI once saw PostgreSQL take over 5 s to accept
// a connection); a wait that asserts speed says its own, shorter, timeout.
export const PATIENCE = 60000;

export const launch = () => chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
