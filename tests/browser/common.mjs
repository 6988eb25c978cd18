// What the browser scripts share: failing with one line, and Debian's
// Chromium launched headless the same way for each.
import { chromium } from "playwright-core";

export const fail = (msg) => { console.error("FAIL: " + msg); process.exit(1); };
export const check = (cond, msg) => { if (!cond) fail(msg); };

export const launch = () => chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
