// Drives the dashboard in headless Chromium, for tests/dashboard_browser.rs:
// the page's defences with a token set.
// 1. the login form, then the page with its security headers, working under
//    its content security policy with no violation and a clean console;
// 2. a key holding a right-to-left override and zero-width characters is
//    shown with them visible (⟨U+202E⟩, ⟨U+200B⟩);
// 3. a page on another port that frames the dashboard (with the operator's
//    session) shows nothing of it;
// 4. once the session has expired, the page sends the browser to the login
//    form (by itself on its next poll, or on the next load).
// Input in the environment:
//   DASH_URL    page URL, e.g. http://127.0.0.1:41234/outbox/
//   DASH_TOKEN  the dashboard token
//   FRAME_URL   a page on another port with <iframe src=DASH_URL>
//   SESSION_TTL_MS the dashboard's session_ttl
// Prints one JSON line of observations; exits non-zero on the first failed check.
import { check, launch, PATIENCE } from "./common.mjs";

const { DASH_URL: url, DASH_TOKEN: token, FRAME_URL: frameUrl, SESSION_TTL_MS: ttl } = process.env;
const browser = await launch();
try {
  const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
  // Every CSP violation of every frame, as the page reports it.
  await context.addInitScript(() => {
    window.__violations = [];
    document.addEventListener("securitypolicyviolation", (e) =>
      window.__violations.push(`${e.violatedDirective}: ${e.blockedURI}`));
  });
  const page = await context.newPage();
  page.setDefaultTimeout(PATIENCE);
  const consoleErrors = [];
  page.on("console", (m) => { if (m.type() === "error" || m.type() === "warning") consoleErrors.push(m.text()); });
  page.on("pageerror", (e) => consoleErrors.push(String(e)));

  await page.goto(url);
  check(page.url().endsWith("/login"), `not sent to the login form: ${page.url()}`);
  await page.fill("input[name=token]", token);
  await Promise.all([page.waitForNavigation(), page.click("button[type=submit]")]);
  const loggedIn = Date.now();
  const response = await page.reload();
  const headers = response.headers();
  const seen = { csp: headers["content-security-policy"], frame_options: headers["x-frame-options"] };
  check((seen.csp || "").includes("frame-ancestors 'none'"), `CSP: ${seen.csp}`);
  check(headers["x-content-type-options"] === "nosniff", "no nosniff");
  check(headers["referrer-policy"] === "no-referrer", "no referrer policy");

  // The page works under its policy: live figures and the message list.
  await page.waitForFunction(() => /\d/.test(document.querySelector("#kpi-pending")?.textContent || ""));
  await page.waitForSelector("#messages tbody tr.clickable");
  const keys = await page.$$eval("#messages tbody tr.clickable", (trs) => trs.map((tr) => tr.children[2].textContent));
  seen.keys = keys;
  check(keys.some((k) => k.includes("⟨U+202E⟩") && k.includes("⟨U+200B⟩")), `keys shown: ${JSON.stringify(keys)}`);
  check(!keys.some((k) => /[\u202E\u200B]/.test(k)), "an invisible character reached the page as it is");
  const others = ["E0069", "034F", "FE0F", "180B", "17B4", "2028"];
  check(keys.some((k) => others.every((c) => k.includes(`⟨U+${c}⟩`))), `every Default_Ignorable, bidi and separator marked: ${JSON.stringify(keys)}`);
  check(!keys.some((k) => /[\u{E0069}\u034F\uFE0F\u180B\u17B4\u2028]/u.test(k)), "a default-ignorable character reached the page as it is");
  // The message's details: its headers with the same marks.
  await page.click("#messages tbody tr.clickable");
  await page.waitForFunction(() => (document.querySelector("#detail-headers")?.textContent || "").length > 2);
  seen.headers = await page.textContent("#detail-headers");
  check(seen.headers.includes("⟨U+202E⟩"), `headers shown: ${seen.headers}`);
  await page.waitForTimeout(2500);
  seen.violations = await page.evaluate(() => window.__violations);
  check(seen.violations.length === 0, `CSP violations: ${JSON.stringify(seen.violations)}`);
  check(consoleErrors.length === 0, `console: ${JSON.stringify(consoleErrors)}`);

  // Framed by another origin, with the session: nothing of the dashboard.
  const framer = await context.newPage();
  await framer.goto(frameUrl);
  await framer.waitForTimeout(1500);
  const frames = framer.frames().filter((f) => f !== framer.mainFrame());
  check(frames.length === 1, `${frames.length} frames`);
  let framed;
  try {
    framed = await frames[0].evaluate(() => document.querySelector("#messages") !== null);
  } catch (e) {
    framed = false; // a frame the browser blocked cannot even be read
  }
  seen.framed_frame_url = frames[0].url();
  check(!framed, "the framed dashboard rendered");

  // The session expires: the page's next poll is refused and sends the
  // browser to the login form by itself (a reload racing that navigation
  // fails with "Not attached to an active page", as CI once saw); if it has
  // not within a few polls, a fresh load must.
  const wait = Number(ttl) - (Date.now() - loggedIn) + 500;
  if (wait > 0) await page.waitForTimeout(wait);
  await page.waitForURL(/\/login$/, { timeout: 10000 }).catch(() => {});
  seen.sent_by_page = page.url().endsWith("/login");
  if (!seen.sent_by_page) await page.goto(url);
  seen.after_expiry = page.url();
  check(page.url().endsWith("/login"), `after expiry: ${page.url()}`);
  console.log(JSON.stringify(seen));
} finally {
  await browser.close();
}
