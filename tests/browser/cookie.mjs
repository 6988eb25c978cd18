// The HTTPS dashboard's session cookie in Chromium: it is `__Host-` and
// Secure; a plain-HTTP page on the same host cannot shadow it with cookies
// of its own (and what it is sent reads nothing: the Rust side replays it).
// Run by tests/dashboard_browser.rs.
//   DASH_URL    the HTTPS page URL (its certificate from the test's own CA)
//   DASH_TOKEN  the dashboard token
//   PLAIN_URL   a plain-HTTP page on the same host, another port
// Prints one JSON line of observations; exits non-zero on the first failed check.
import { check, launch, PATIENCE } from "./common.mjs";

const { DASH_URL: url, DASH_TOKEN: token, PLAIN_URL: plain } = process.env;
const browser = await launch();
const seen = {};
try {
  const context = await browser.newContext({ ignoreHTTPSErrors: true });
  const page = await context.newPage();
  page.setDefaultTimeout(PATIENCE);
  await page.goto(url);
  check(page.url().endsWith("/login"), `not sent to the login form: ${page.url()}`);
  await page.fill("input[name=token]", token);
  await Promise.all([page.waitForNavigation(), page.click("button[type=submit]")]);
  const cookies = await context.cookies();
  seen.cookies = cookies.map((c) => ({ name: c.name, secure: c.secure, path: c.path, httpOnly: c.httpOnly }));
  check(cookies.some((c) => c.name === "__Host-outboxd_session" && c.secure && c.httpOnly && c.path === "/"),
    `no Secure __Host- session cookie: ${JSON.stringify(seen.cookies)}`);

  // A plain-HTTP page on the same host (the test's server records what it
  // is sent), which then tries to toss cookies over the session.
  await page.goto(plain);
  await page.evaluate(() => {
    document.cookie = "outboxd_session=junk; path=/outbox/api";
    document.cookie = "__Host-outboxd_session=junk; path=/";
  });
  seen.after_toss = (await context.cookies()).map((c) => `${c.name} secure=${c.secure} path=${c.path}`);
  check(!(await context.cookies()).some((c) => c.name === "__Host-outboxd_session" && c.value === "junk"),
    "a plain-HTTP page set the __Host- cookie");

  // The dashboard still knows the session.
  await page.goto(url);
  check(!page.url().endsWith("/login"), `sent to the login form after the tossed cookies: ${page.url()}`);
  seen.api_status = await page.evaluate(() => fetch("api/summary", {
    credentials: "same-origin",
    headers: { "X-Outboxd-Session": localStorage.getItem("outboxd-session-key") || "" },
  }).then((r) => r.status));
  check(seen.api_status === 200, `api/summary answered ${seen.api_status}`);
  console.log(JSON.stringify(seen));
} finally {
  await browser.close();
}
