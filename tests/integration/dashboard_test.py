#!/usr/bin/env python3
"""Opens Cohort's dashboard in headless Chromium and checks that it draws the run.

  dashboard_test.py --url http://127.0.0.1:9100/ --screenshot out.png [--min-rounds 2]
  dashboard_test.py --with-fake-server --screenshot out.png      (serves dashboard_fake_server.py)

Waits (at most --timeout seconds) until the page's test hook (window.cohortDashboard, set by
observe/dashboard/dashboard.js) reports at least --min-rounds rounds and every chart holds that
many points (the accuracy chart: at least one, as not every round is evaluated; none with
--no-accuracy), and with --until-finished until the run has ended and the page stopped polling
(state finished or failed, one last refresh), then saves a screenshot of the --window-sized viewport. Fails (exit 1) when the
page shows no curve in time, when the browser console logged an error (any SEVERE entry:
JavaScript errors, failed loads), when the hook lists errors, or when the status header stayed
empty. The browser, its driver and the fake server are stopped on every path out.

Needs Debian's chromium, chromium-driver and python3-selenium (run it with /usr/bin/python3).
"""

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_SERVER = os.path.join(HERE, "dashboard_fake_server.py")
CHARTS = ("chart-accuracy", "chart-loss", "chart-time", "chart-bytes")

# Read in the page each poll: the hook, and each chart's points as Chart.js holds them.
PROBE_JS = """
const hook = window.cohortDashboard;
if (!hook) return null;
const charts = {};
for (const canvas of document.querySelectorAll('canvas')) {
  const chart = window.Chart ? window.Chart.getChart(canvas) : undefined;
  charts[canvas.id] = chart ? {
    width: canvas.clientWidth, height: canvas.clientHeight,
    datasets: chart.data.datasets.map((d, i) => ({
      label: d.label, points: d.data.filter((v) => v !== null && v !== undefined).length,
      drawn: chart.getDatasetMeta(i).data.length})),
  } : null;
}
return {roundsShown: hook.roundsShown, lastRound: hook.lastRound, errors: hook.errors.slice(),
        networkErrors: hook.networkErrors, polls: hook.polls, state: hook.state,
        stopped: hook.stopped, charts,
        header: document.getElementById('h-state') ? document.getElementById('h-state').textContent : null,
        clientRows: document.querySelectorAll('#clients-table tbody tr:not(:has(td.empty))').length,
        statusLine: document.getElementById('status-line') ? document.getElementById('status-line').textContent : null};
"""


class Failure(Exception):
    pass


def on_parent_death_sigterm():
    """preexec_fn: the child gets SIGTERM if this process dies (even by SIGKILL)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def start_fake_server(args, workdir):
    port_file = os.path.join(workdir, "port")
    command = [sys.executable, FAKE_SERVER, "--port", "0", "--port-file", port_file,
               "--rounds", str(args.fake_rounds), "--rounds-per-second", str(args.fake_rate),
               "--clients", str(args.fake_clients),
               "--max-seconds", str(args.timeout + 120)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, preexec_fn=on_parent_death_sigterm)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Failure(f"the fake server exited at start with status {proc.returncode}")
        if os.path.exists(port_file):
            with open(port_file) as f:
                return proc, f"http://127.0.0.1:{int(f.read())}/"
        time.sleep(0.1)
    raise Failure("the fake server did not report its port within 15 s")


def stop_process(proc):
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def start_browser(args, workdir):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        raise Failure(f"selenium is missing ({e}): install Debian's python3-selenium and run this "
                      "with /usr/bin/python3")
    chromium = args.chromium or shutil.which("chromium") or "/usr/bin/chromium"
    chromedriver = args.chromedriver or shutil.which("chromedriver") or "/usr/bin/chromedriver"
    for path, package in ((chromium, "chromium"), (chromedriver, "chromium-driver")):
        if not os.path.exists(path):
            raise Failure(f"{path} is missing: install Debian's {package}")
    width, height = args.window
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--disable-extensions", "--disable-background-networking",
                 "--hide-scrollbars", f"--window-size={width},{height}",
                 f"--user-data-dir={os.path.join(workdir, 'profile')}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=chromedriver, log_path=os.path.join(workdir, "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(10)
    # The viewport exactly WIDTHxHEIGHT, whatever the window decorations of this Chromium.
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    return driver


# Console messages of requests that got no reply at all (the server gone or not yet up).
CONNECTION_ERRORS = ("net::ERR_CONNECTION_REFUSED", "net::ERR_CONNECTION_RESET",
                     "net::ERR_EMPTY_RESPONSE", "net::ERR_CONNECTION_CLOSED")


def severe_entries(driver, seen, allow_connection_errors):
    """Collects new browser-console entries into seen; returns the SEVERE ones among all."""
    seen.extend(driver.get_log("browser"))
    severe = [e for e in seen if e.get("level") == "SEVERE"]
    if allow_connection_errors:
        severe = [e for e in severe if not any(c in e.get("message", "") for c in CONNECTION_ERRORS)]
    return severe


def chart_shortfall(probe, args):
    """What is still missing for the page to count as drawn; empty when it is."""
    missing = []
    if probe is None:
        return ["window.cohortDashboard is not set (did /static/dashboard.js load?)"]
    if probe["roundsShown"] < args.min_rounds:
        missing.append(f"{probe['roundsShown']} rounds shown, waiting for {args.min_rounds}")
    for chart_id in CHARTS:
        chart = probe["charts"].get(chart_id)
        if chart is None:
            missing.append(f"#{chart_id} has no chart")
            continue
        if chart["width"] == 0 or chart["height"] == 0:
            missing.append(f"#{chart_id} has no size")
        need = args.min_rounds
        if chart_id == "chart-accuracy":
            need = 0 if args.no_accuracy else 1
        best = max((d["points"] for d in chart["datasets"]), default=0)
        drawn = max((d["drawn"] for d in chart["datasets"]), default=0)
        if best < need or drawn < need:
            missing.append(f"#{chart_id} has {best} points, waiting for {need}")
    if probe["header"] in (None, "", "\u2013"):
        missing.append("the status header is empty")
    if args.until_finished and not probe["stopped"]:
        missing.append(f"the page still polls (state {probe['state']}), waiting for it to stop")
    return missing


def check_page(driver, args):
    driver.get(args.url)
    deadline = time.monotonic() + args.timeout
    console = []
    probe, missing = None, ["not probed yet"]
    while time.monotonic() < deadline:
        probe = driver.execute_script(PROBE_JS)
        severe = severe_entries(driver, console, args.allow_connection_errors)
        if severe:
            raise Failure("the browser console logged errors:\n  " +
                          "\n  ".join(f"{e.get('source', '?')}: {e.get('message')}" for e in severe))
        if probe is not None and probe["errors"]:
            raise Failure("the page reports errors:\n  " + "\n  ".join(probe["errors"]))
        missing = chart_shortfall(probe, args)
        if not missing:
            break
        time.sleep(0.5)
    else:
        raise Failure(f"no complete curve within {args.timeout:.0f} s: " + "; ".join(missing) +
                      f"\nlast probe: {json.dumps(probe)}")
    time.sleep(args.settle)  # let the latest poll's tables render before the picture
    if args.screenshot:
        os.makedirs(os.path.dirname(os.path.abspath(args.screenshot)), exist_ok=True)
        if not driver.save_screenshot(args.screenshot):
            raise Failure(f"could not write the screenshot {args.screenshot}")
    probe = driver.execute_script(PROBE_JS)
    severe = severe_entries(driver, console, args.allow_connection_errors)
    if severe or probe["errors"]:
        raise Failure(f"errors after the curves were drawn: console {severe}, page {probe['errors']}")
    return probe


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="the dashboard's address, e.g. http://127.0.0.1:9100/")
    target.add_argument("--with-fake-server", action="store_true",
                        help="start dashboard_fake_server.py on a free loopback port and test that")
    parser.add_argument("--screenshot", help="write a PNG of the page here")
    parser.add_argument("--min-rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the curves")
    parser.add_argument("--until-finished", action="store_true",
                        help="also wait until the run ends and the page stops polling")
    parser.add_argument("--allow-connection-errors", action="store_true",
                        help="ignore console entries of requests refused or unanswered (a server "
                             "that exits when its run ends)")
    parser.add_argument("--no-accuracy", action="store_true",
                        help="do not require an accuracy point (runs that never evaluate)")
    parser.add_argument("--window", default="1400x1000", help="viewport WIDTHxHEIGHT")
    parser.add_argument("--settle", type=float, default=2.0,
                        help="seconds between the curves' showing and the screenshot")
    parser.add_argument("--fake-rounds", type=int, default=30)
    parser.add_argument("--fake-rate", type=float, default=2.0, help="fake rounds per second")
    parser.add_argument("--fake-clients", type=int, default=8)
    parser.add_argument("--chromium")
    parser.add_argument("--chromedriver")
    args = parser.parse_args()
    width, _, height = args.window.partition("x")
    args.window = (int(width), int(height))
    return args


def main():
    args = parse_args()
    # SIGTERM (CTest, a shell's kill) takes the same path out as a failure: finally blocks run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("dashboard_test: terminated"))
    workdir = tempfile.mkdtemp(prefix="cohort-dashboard-test-")
    server, driver = None, None
    try:
        if args.with_fake_server:
            server, args.url = start_fake_server(args, workdir)
        driver = start_browser(args, workdir)
        probe = check_page(driver, args)
        print(f"dashboard_test: PASS {args.url}: {probe['roundsShown']} rounds shown (last "
              f"{probe['lastRound']}), state {probe['state']}, {probe['clientRows']} client rows, "
              f"{probe['polls']} polls, {probe['networkErrors']} requests without reply"
              + (f"; screenshot {args.screenshot}" if args.screenshot else ""))
        return 0
    except Failure as e:
        print(f"dashboard_test: FAIL {args.url or ''}: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a WebDriver failure (browser did not start, crashed) is a failure too
        print(f"dashboard_test: FAIL {args.url or ''}: {type(e).__name__}: {e}", file=sys.stderr)
        log = os.path.join(workdir, "chromedriver.log")
        if os.path.exists(log):
            with open(log, errors="replace") as f:
                print("chromedriver log (tail):\n" + f.read()[-3000:], file=sys.stderr)
        return 1
    finally:
        if driver is not None:
            try:
                driver.quit()
            except Exception as e:  # still stop the server and remove the profile
                print(f"dashboard_test: quitting the browser: {e}", file=sys.stderr)
        stop_process(server)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
