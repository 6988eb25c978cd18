// Drives the dashboard in headless Chromium (Debian's, via playwright-core).
// Run by tests/dashboard_browser.rs, which sets up a real fleet and checks
// the database afterwards. Input in the environment:
//   DASH_URL       page URL, e.g. http://127.0.0.1:41234/outbox/
//   DASH_EXPECT    JSON: { workers: [ids], owners: {bucket: owner id}, parkedId,
//                  queue, stream: the two destinations traffic goes to }
//   DASH_STOP_PID, DASH_STOP_ID  a worker (pid, id) to SIGTERM once the page is
//                  up: its buckets' takeovers must appear on the lease timeline
//   DASH_SCREENSHOT  optional PNG path
//   DASH_SIGNAL    a file to create once the Failed tab shows (the test then
//                  parks a message with key "parked-later", which must appear
//                  without a reload or a click)
// Prints one JSON line of observations; exits non-zero on the first failed check.
import { writeFileSync } from "node:fs";
import { check, launch, PATIENCE } from "./common.mjs";

const url = process.env.DASH_URL;
const expect = JSON.parse(process.env.DASH_EXPECT);
const browser = await launch();
const seen = {};
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1100 } });
  let navigations = 0;
  page.on("framenavigated", (f) => { if (f === page.mainFrame()) navigations += 1; });
  const dialogs = [];
  page.on("dialog", async (d) => { dialogs.push(d.message()); await d.accept(); });
  page.setDefaultTimeout(PATIENCE);

  const opened = Date.now();
  const summary = page.waitForResponse((r) => r.url().includes("/api/summary"));
  await page.goto(url);
  // The page fetches the summary at once and shows its figures as soon as
  // it is in (not after the slower reads, not at the next poll). Not timed
  // against a wall clock: a loaded machine may take seconds to answer.
  await summary;
  seen.summary_ms = Date.now() - opened;
  await page.waitForFunction(() => ["#kpi-workers", "#kpi-pending", "#kpi-now", "#kpi-rate"].every((k) => !["–", ""].includes(document.querySelector(k).textContent)), null, { timeout: 5000 });
  seen.first_figures_ms = Date.now() - opened;
  // Workers: every live worker of the fleet, by id, with its real bucket count.
  await page.waitForFunction((n) => document.querySelectorAll("#workers tbody tr[data-worker]:not(.gone)").length === n, expect.workers.length);
  const rows = await page.$$eval("#workers tbody tr[data-worker]", (trs) => trs.map((tr) => ({ id: tr.dataset.worker, buckets: Number(tr.querySelector(".buckets").textContent) })));
  for (const id of expect.workers) check(rows.some((r) => r.id === id), `worker ${id} not shown`);
  check(rows.reduce((a, r) => a + r.buckets, 0) === 16, `bucket counts ${JSON.stringify(rows)} do not add up to 16`);
  check(await page.textContent("#kpi-workers") === String(expect.workers.length), "workers KPI");
  seen.workers = rows;

  // Leases: each bucket's owner as in the database.
  const owners = await page.$$eval("#partitions tbody tr", (trs) => Object.fromEntries(trs.map((tr) => [tr.dataset.bucket, tr.children[1].getAttribute("title")])));
  for (const [bucket, owner] of Object.entries(expect.owners)) check(owners[bucket] === owner, `bucket ${bucket}: page says ${owners[bucket]}, database ${owner}`);
  seen.buckets = Object.keys(owners).length;

  // Throughput: real numbers and bars.
  await page.waitForFunction(() => Number(document.querySelector("#kpi-hour").textContent.replace(/,/g, "")) > 0);
  seen.published_last_hour_first = Number((await page.textContent("#kpi-hour")).replace(/,/g, ""));
  check(await page.$$eval("#chart rect.bar", (r) => r.length) === 60, "chart bars");

  // Live: the number changes without a reload (a producer is running).
  const before = navigations;
  await page.waitForFunction((v) => Number(document.querySelector("#kpi-hour").textContent.replace(/,/g, "")) > v, seen.published_last_hour_first);
  seen.published_last_hour_later = Number((await page.textContent("#kpi-hour")).replace(/,/g, ""));
  check(navigations === before, "the page reloaded");

  // The live per-second rate, and the lease timeline showing today's owners.
  await page.waitForFunction(() => parseFloat(document.querySelector("#kpi-now").textContent) > 0);
  seen.publishing_now = await page.textContent("#kpi-now");
  // The figures agree: publishing now means the last 60 s and the last hour
  // are not 0.
  const figure = (k) => page.$eval(k, (e) => Number(e.textContent.replace(/[^0-9.]/g, "")));
  seen.last_60s = await figure("#kpi-rate");
  check(seen.last_60s > 0, `publishing ${seen.publishing_now} but the last 60 s show ${seen.last_60s}`);
  check(await figure("#kpi-hour") >= seen.last_60s, "the last hour shows less than the last 60 s");
  check(/\/s$/.test(await page.textContent("#live-max")) && /\/min$/.test(await page.textContent("#chart-max")), "the charts' y-axes have no units");
  check(await page.$$eval("#live rect.bar", (r) => r.length) === 300, "live chart bars");
  const current = await page.$$eval("#timeline rect.held", (rs) => {
    const last = {};
    for (const r of rs) if (!last[r.dataset.bucket] || Number(r.getAttribute("x")) >= last[r.dataset.bucket].x) last[r.dataset.bucket] = { x: Number(r.getAttribute("x")), owner: r.dataset.owner };
    return Object.fromEntries(Object.entries(last).map(([b, v]) => [b, v.owner]));
  });
  for (const [bucket, owner] of Object.entries(expect.owners)) check(current[bucket] === owner, `timeline: bucket ${bucket} ends with ${current[bucket]}, database says ${owner}`);

  // Every live worker has a colour of its own in the legend, and none is red
  // (red marks take-overs and errors).
  const swatches = await page.$$eval("#tl-legend > span:not(.gone)", (ss) => ss.map((s) => ({ id: s.dataset.worker, colour: getComputedStyle(s.querySelector(".swatch")).backgroundColor })));
  for (const id of expect.workers) check(swatches.some((s) => s.id === id), `worker ${id} missing from the legend`);
  check(new Set(swatches.map((s) => s.colour)).size === swatches.length, `live workers share a colour: ${JSON.stringify(swatches)}`);
  for (const { colour } of swatches) {
    const [r, g, b] = colour.match(/\d+/g).map(Number);
    check(!(r > 150 && g < 110 && b < 110), `a live worker is red: ${colour}`);
  }
  seen.legend = swatches;

  // A worker publishing (its rate above 0) is shown as publishing, never idle.
  await page.waitForFunction(() => [...document.querySelectorAll("#workers tbody tr[data-worker]:not(.gone)")].some((tr) => parseFloat(tr.querySelector(".rate").textContent) > 0));
  const states = await page.$$eval("#workers tbody tr[data-worker]:not(.gone)", (trs) => trs.map((tr) => ({ rate: parseFloat(tr.querySelector(".rate").textContent), state: tr.querySelector(".state").textContent })));
  for (const w of states) if (w.rate > 0) check(w.state === "publishing", `a worker at ${w.rate}/s is shown as ${w.state}`);
  seen.states = states;

  // States come from the last ten seconds, not one instant: with traffic
  // flowing, no bucket that published lately says idle, and every worker's
  // word on the page is the API's (the one `outboxd status` prints), over
  // several polls.
  const api = new URL("api/summary", url).toString();
  for (let poll = 0; poll < 5; poll++) {
    await page.waitForTimeout(2100);
    const shown = await page.evaluate(() => ({
      buckets: Object.fromEntries([...document.querySelectorAll("#partitions tbody tr[data-bucket]")]
        .map((tr) => [tr.dataset.bucket, tr.querySelector(".status").textContent.trim()])),
      workers: Object.fromEntries([...document.querySelectorAll("#workers tbody tr[data-worker]")]
        .map((tr) => [tr.dataset.worker, tr.querySelector(".state").textContent.trim()])),
    }));
    const summary = await page.evaluate((u) => fetch(u, { credentials: "same-origin" }).then((r) => r.json()), api);
    for (const b of summary.partitions) {
      if (b.rate > 0) check(!(shown.buckets[b.partition_key] || "").startsWith("idle"), `bucket ${b.partition_key} published ${b.rate}/s lately but says "${shown.buckets[b.partition_key]}"`);
    }
    for (const w of summary.workers) {
      const word = shown.workers[w.worker_id];
      if (word !== undefined) check(word === w.state || word.startsWith(`${w.state} ·`), `worker ${w.name}: the page says "${word}", the API "${w.state}"`);
    }
    const publishing = summary.partitions.filter((b) => b.state === "publishing").length;
    seen.publishing_buckets = Math.max(seen.publishing_buckets || 0, publishing);
  }
  check(seen.publishing_buckets > 0, "no bucket was ever shown publishing while traffic flowed");

  // Destinations: the queue through AMQP and the stream through the stream
  // protocol, each with its sink, and the page's figures the API's; the
  // counts move without a reload.
  const destinations = () => page.$$eval("#destinations tbody tr[data-destination]", (trs) => Object.fromEntries(trs.map((tr) => [tr.dataset.destination, {
    sink: tr.querySelector(".sink").textContent.trim(),
    delivered: Number(tr.querySelector(".delivered").textContent.replace(/,/g, "")),
  }])));
  const queueRow = `queue:${expect.queue}`, streamRow = `stream:${expect.stream}`;
  await page.waitForFunction(([q, s]) => [q, s].every((d) => document.querySelector(`#destinations tbody tr[data-destination="${d}"]`)), [queueRow, streamRow]);
  const shownFirst = await destinations();
  check(shownFirst[queueRow].sink === "AMQP queue", `the queue's sink is shown as "${shownFirst[queueRow].sink}"`);
  check(shownFirst[streamRow].sink === "stream", `the stream's sink is shown as "${shownFirst[streamRow].sink}"`);
  const summaryNow = await page.evaluate((u) => fetch(u, { credentials: "same-origin" }).then((r) => r.json()), api);
  for (const d of summaryNow.destinations) {
    const key = `${d.kind}:${d.name}`;
    check(shownFirst[key] !== undefined, `destination ${key} of the API is not on the page`);
  }
  await page.waitForFunction(([s, n]) => Number(document.querySelector(`#destinations tbody tr[data-destination="${s}"] .delivered`).textContent.replace(/,/g, "")) > n, [streamRow, shownFirst[streamRow].delivered]);
  seen.destinations = await destinations();

  // A worker stops: the survivors' acquisitions of its buckets appear on
  // the timeline without a reload.
  if (process.env.DASH_STOP_PID) {
    const stopped = process.env.DASH_STOP_ID;
    const theirs = Object.entries(expect.owners).filter(([, o]) => o === stopped).map(([b]) => b);
    check(theirs.length > 0, "the stopped worker held no bucket");
    const acquisitions = () => page.$$eval('#timeline rect.ev[data-action="acquire"]', (rs) => rs.map((r) => `${r.dataset.bucket}@${r.dataset.at}`));
    const earlier = await acquisitions();
    const stoppedAt = navigations;
    process.kill(Number(process.env.DASH_STOP_PID), "SIGTERM");
    await page.waitForFunction(([buckets, gone, old]) => buckets.every((b) =>
      [...document.querySelectorAll(`#timeline rect.ev[data-action="acquire"][data-bucket="${b}"]`)]
        .some((r) => r.dataset.worker !== gone && !old.includes(`${b}@${r.dataset.at}`))), [theirs, stopped, earlier]);
    await page.waitForFunction(([buckets, gone]) => buckets.every((b) =>
      [...document.querySelectorAll(`#timeline rect.ev[data-action="release"][data-bucket="${b}"]`)].some((r) => r.dataset.worker === gone)), [theirs, stopped]);
    check(navigations === stoppedAt, "the page reloaded");
    seen.taken_over = theirs;
  }

  if (process.env.DASH_SCREENSHOT) await page.screenshot({ path: process.env.DASH_SCREENSHOT, fullPage: false });

  // A message parked while the Failed tab is open appears there by itself.
  await page.click('.tabs button[data-state="failed"]');
  await page.waitForSelector(`#messages tr[data-id="${expect.parkedId}"]`);
  const keysShown = () => page.$$eval("#messages tbody tr[data-id]", (trs) => trs.map((tr) => tr.children[2].textContent));
  check(!(await keysShown()).includes("parked-later"), "parked-later was parked before it was asked for");
  if (process.env.DASH_SIGNAL) {
    const beforeLater = navigations;
    writeFileSync(process.env.DASH_SIGNAL, "failed tab open\n");
    await page.waitForFunction(() => [...document.querySelectorAll("#messages tbody tr[data-id]")].some((tr) => tr.children[2].textContent === "parked-later"));
    check(navigations === beforeLater, "the page reloaded");
    seen.parked_later_shown = true;
  }

  // Requeue the parked message through the UI.
  const button = `button.requeue-one[data-id="${expect.parkedId}"]`;
  await page.waitForSelector(button);
  await page.click(button);
  // confirm() is answered yes; then the page alerts the result.
  const deadline = Date.now() + 20000;
  while (!dialogs.some((m) => m.startsWith("Requeued")) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  check(dialogs.some((m) => m.startsWith("Requeue message")), `no confirmation asked: ${JSON.stringify(dialogs)}`);
  check(dialogs.includes("Requeued 1 message(s)."), `requeue not confirmed: ${JSON.stringify(dialogs)}`);
  await page.waitForFunction((id) => !document.querySelector(`#messages tr[data-id="${id}"]`), expect.parkedId);
  seen.dialogs = dialogs;
  console.log(JSON.stringify(seen));
} finally {
  await browser.close();
}
