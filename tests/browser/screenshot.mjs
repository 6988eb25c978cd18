// Saves a screenshot of a running dashboard (the README's picture):
//   node tests/browser/screenshot.mjs http://127.0.0.1:8080/outbox/ docs/dashboard.png
import { chromium } from "playwright-core";

const [url, path] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--no-first-run"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1100 } });
  await page.goto(url);
  await page.waitForFunction(() => document.querySelectorAll("#timeline rect.held").length > 0);
  await page.waitForTimeout(2500);
  await page.screenshot({ path, fullPage: false });
} finally {
  await browser.close();
}
