// The all-sources overview (`outboxd ui` with several sources) live in the
// browser. Run by tests/dashboard_browser.rs: three sources, a worker
// serving them. Input in the environment:
//   DASH_URL     the overview's URL
//   DASH_EXPECT  JSON: { sources: [names], stopped: the name whose database
//                the test stops once this script prints "ready",
//                bad: [{ name, why, secret }]: sources that cannot be
//                served (a wrong password, a schema not migrated):
//                unhealthy from the start, each reason containing `why` and
//                never `secret` }
// Prints "ready" once every source shows healthy with a live worker, then
// one JSON line of observations; exits non-zero on the first failed check.
import { check, fail, launch, PATIENCE } from "./common.mjs";

const expect = JSON.parse(process.env.DASH_EXPECT);
const browser = await launch();
const seen = {};
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  page.setDefaultTimeout(PATIENCE);
  await page.goto(process.env.DASH_URL);
  const row = (name) => `#sources tbody tr[data-source="${name}"]`;

  // What the table shows, for a failed wait's message.
  const shown = () => page.evaluate(() => ({
    updated: document.querySelector("#updated")?.textContent,
    rows: [...document.querySelectorAll("#sources tbody tr")].map((tr) =>
      `${tr.dataset.source} ${tr.className} workers=${tr.querySelector(".workers")?.textContent} err=${tr.querySelector(".err")?.textContent}`),
  }));
  // Every source healthy, each with its worker.
  for (const name of expect.sources) {
    try {
      await page.waitForFunction((sel) => {
        const tr = document.querySelector(sel);
        return tr && tr.classList.contains("healthy") && Number(tr.querySelector(".workers").textContent) >= 1;
      }, row(name));
    } catch (e) {
      fail(`${name} not shown healthy with a worker: ${e.message.split("\n")[0]}; the page shows ${JSON.stringify(await shown())}`);
    }
  }
  // The sources that cannot be served: unhealthy from the start, and why.
  seen.bad = [];
  for (const bad of expect.bad) {
    await page.waitForSelector(`${row(bad.name)}.unhealthy`);
    // The reason of the dashboard's latest attempt: one that found the
    // database slow to answer (a loaded machine) says "no answer" until the
    // next attempt, so the reason is waited for, not read once.
    const says = await page.waitForFunction(
      ([sel, why]) => document.querySelector(sel)?.textContent.includes(why),
      [`${row(bad.name)} .err`, bad.why],
    ).then(() => true, () => false);
    const badWhy = (await page.textContent(`${row(bad.name)} .err`)).trim();
    check(says && badWhy.includes(bad.why), `${bad.name}'s reason does not say ${bad.why}: ${badWhy}`);
    const text = await page.textContent("body");
    check(!text.includes(bad.secret), "the page shows the wrong password");
    seen.bad.push({ source: bad.name, why: badWhy });
  }
  const links = await page.$$eval("#sources tbody tr .name a", (as) => as.map((a) => a.getAttribute("href")));
  check(links.length === expect.sources.length + expect.bad.length, `rows: ${links}`);
  seen.healthy_first = expect.sources;
  // Reloading would reset this; the change must come by polling.
  await page.evaluate(() => { window.__sameDocument = true; });
  console.log("ready");

  // The test stops one source's database: its row turns unhealthy with the
  // reason, the others stay healthy.
  await page.waitForSelector(`${row(expect.stopped)}.unhealthy`, { timeout: 60000 });
  check(await page.evaluate(() => window.__sameDocument === true), "the page was reloaded");
  const why = (await page.textContent(`${row(expect.stopped)} .err`)).trim();
  check(why.length > 0, "the unhealthy source does not say why");
  seen.unhealthy = { source: expect.stopped, why };
  for (const name of expect.sources.filter((n) => n !== expect.stopped)) {
    const healthy = await page.$eval(row(name), (tr) => tr.classList.contains("healthy"));
    check(healthy, `${name} is not shown healthy while only ${expect.stopped} is stopped`);
  }
  const unhealthyCount = (await page.textContent("#kpi-unhealthy")).trim();
  const expected = String(1 + expect.bad.length);
  check(unhealthyCount === expected, `unhealthy count ${unhealthyCount}, not ${expected} (the stopped and the bad sources)`);
  seen.others_healthy = expect.sources.filter((n) => n !== expect.stopped);

  // Each source's own dashboard is a click away.
  const first = expect.sources.find((n) => n !== expect.stopped);
  await page.click(`${row(first)} .name a`);
  await page.waitForFunction(() => Number(document.querySelector("#kpi-workers").textContent) >= 1);
  seen.opened = page.url();
  console.log(JSON.stringify(seen));
} finally {
  await browser.close();
}
