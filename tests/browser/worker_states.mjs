// The workers table and legend say who each worker is and what it is
// doing. Run by tests/dashboard_browser.rs against a real 2-worker fleet
// (2 buckets): one worker's only bucket is blocked on a failing head, the
// other publishes. Input in the environment:
//   DASH_URL     page URL
//   DASH_EXPECT  JSON: { names: {id: name}, blocked: id, publishing: id,
//                retryAt: the blocked head's available_at (ISO),
//                blockedBucket: its bucket }
// Last, the blocked head is parked with its bucket's Park button.
// Prints one JSON line of observations; exits non-zero on the first failed check.
import { check, launch, PATIENCE } from "./common.mjs";

const expect = JSON.parse(process.env.DASH_EXPECT);
const browser = await launch();
const seen = {};
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1100 } });
  page.setDefaultTimeout(PATIENCE);
  await page.goto(process.env.DASH_URL);
  const row = (id) => `#workers tbody tr[data-worker="${id}"]`;
  await page.waitForSelector(row(expect.blocked));
  await page.waitForSelector(row(expect.publishing));

  // Each worker by its name (worker.name, or host:pid), in the table and
  // in the lease legend.
  for (const [id, name] of Object.entries(expect.names)) {
    const shown = await page.textContent(`${row(id)} .name`);
    check(shown === name, `worker ${id} shown as ${shown}, expected ${name}`);
    const legend = await page.textContent(`#tl-legend > span[data-worker="${id}"]`);
    check(legend.trim() === name, `legend shows ${legend} for ${name}`);
  }
  seen.names = expect.names;

  // The publishing worker says so; the other waits on its blocked head and
  // says when it is retried next (the database's available_at).
  await page.waitForFunction((sel) => parseFloat(document.querySelector(sel).textContent) > 0, `${row(expect.publishing)} .rate`);
  await page.waitForFunction((sel) => document.querySelector(sel).textContent === "publishing", `${row(expect.publishing)} .state`);
  const retry = await page.evaluate((at) => new Date(at).toLocaleTimeString(), expect.retryAt);
  const state = await page.textContent(`${row(expect.blocked)} .state`);
  check(state === `blocked head · retry ${retry}`, `the blocked worker says "${state}", expected "blocked head · retry ${retry}"`);
  seen.blocked_state = state;
  const states = await page.$$eval("#workers tbody tr[data-worker] .state", (cells) => cells.map((c) => c.textContent));
  check(!states.some((s) => s.startsWith("idle")), `a worker is labelled idle: ${states}`);
  // The bucket table names the owner the same way.
  const owners = await page.$$eval("#partitions tbody tr td:nth-child(2)", (tds) => tds.map((td) => td.textContent));
  check(owners.includes(expect.names[expect.blocked]) && owners.includes(expect.names[expect.publishing]), `bucket owners shown as ${owners}`);

  // The blocked bucket offers the ways out; Park (confirmed) unblocks it.
  const park = `#partitions tbody tr[data-bucket="${expect.blockedBucket}"] .head-act[data-action="park"]`;
  for (const action of ["retry", "park", "drop"]) {
    await page.waitForSelector(`#partitions tbody tr[data-bucket="${expect.blockedBucket}"] .head-act[data-action="${action}"]`);
  }
  page.on("dialog", (dialog) => dialog.accept());
  await page.click(park);
  await page.waitForFunction((sel) => !document.querySelector(sel), park);
  seen.parked_from_the_page = true;
  console.log(JSON.stringify(seen));
} finally {
  await browser.close();
}
