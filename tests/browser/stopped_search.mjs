// Drives the dashboard in headless Chromium, for tests/dashboard_browser.rs:
// 1. a slow answer for the Published view (held up 3 s on its way) does not
//    overwrite the Failed view chosen after it;
// 2. a search of published messages by key that the database stops (the test
//    holds a lock on the outbox table meanwhile) shows why in place of the rows.
// Input in the environment:
//   DASH_URL     page URL, e.g. http://127.0.0.1:41234/outbox/
//   DASH_KEY     the key to search (one published message has it)
//   DASH_SIGNAL  a path prefix: this script creates DASH_SIGNAL.ready once
//                the search is typed in, and submits it once the test has
//                created DASH_SIGNAL.locked
// Prints one JSON line of observations; exits non-zero on the first failed check.
import { existsSync, writeFileSync } from "node:fs";
import { check, launch, PATIENCE } from "./common.mjs";

const { DASH_URL: url, DASH_KEY: key, DASH_SIGNAL: signal } = process.env;
const browser = await launch();
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1100 } });
  page.setDefaultTimeout(PATIENCE);
  await page.goto(url);
  await page.waitForSelector("#messages tbody tr");
  // A slow answer must not overwrite the view chosen after it: the Published
  // list is held up on its way (3 s), the Failed tab is chosen meanwhile.
  const slow = "**/api/messages?state=published*";
  await page.route(slow, async (route) => { await new Promise((r) => setTimeout(r, 3000)); await route.continue(); });
  await page.click(".tabs button[data-state=published]");
  await page.click(".tabs button[data-state=failed]");
  await page.waitForTimeout(4000);
  const shown = (await page.textContent("#messages tbody")).replace(/\s+/g, " ").trim();
  check(shown.includes("No failed messages"), `the Failed tab shows: ${shown}`);
  await page.unroute(slow);
  // Before the lock: the Published view lists the message.
  await page.click(".tabs button[data-state=published]");
  await page.waitForFunction((k) => [...document.querySelectorAll("#messages tbody tr.clickable")]
    .some((tr) => tr.children[2].textContent === k), key);
  await page.fill("#search-key", key);
  writeFileSync(signal + ".ready", "");
  const deadline = Date.now() + 20000;
  while (!existsSync(signal + ".locked")) {
    check(Date.now() < deadline, "the test never took its lock");
    await new Promise((r) => setTimeout(r, 50));
  }
  const started = Date.now();
  await page.click("#search button[type=submit]");
  // The error takes the whole row (a row of messages has a last-error cell too).
  const cell = await page.waitForSelector("#messages tbody td.err[colspan]", { timeout: 15000 });
  const seen = { after_ms: Date.now() - started, text: await cell.textContent() };
  seen.rows = await page.$$eval("#messages tbody tr", (trs) => trs.length);
  seen.next_page_disabled = await page.$eval("#next-page", (b) => b.disabled);
  check(seen.text.includes("searching published messages by key") && seen.text.includes("within 5s"), `the page says: ${seen.text}`);
  check(seen.rows === 1, `${seen.rows} rows beside the message`);
  check(seen.next_page_disabled, "next page still enabled");
  console.log(JSON.stringify(seen));
} finally {
  await browser.close();
}
