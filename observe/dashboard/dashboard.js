// Cohort's dashboard script (docs/HTTP_API.md). Polls /api/v1/status and, incrementally,
// /api/v1/rounds?since=N; draws the rounds with Chart.js (served at /static/chart.js) and the
// status as tables. Plain browser JavaScript: no build step, no framework besides Chart.js.
//
// Test hook: window.cohortDashboard, read by tests/integration/dashboard_test.py:
//   roundsShown    rounds drawn in the charts        lastRound  the newest round drawn
//   errors         unexpected failures (HTTP errors, malformed replies, exceptions): a test fails on any
//   networkErrors  requests that got no reply at all (server gone or restarting): counted, not errors
//   polls, state, stopped
'use strict';

(function () {
  const POLL_MS = 1500;
  const REQUEST_TIMEOUT_MS = 5000;
  const MAX_POINTS = 5000;        // rounds kept in the charts; older ones are dropped
  const MAX_PAGES_PER_POLL = 20;  // /rounds replies hold at most 1000 rounds each
  const MAX_CLIENT_ROWS = 200;
  const MAX_ERRORS_KEPT = 50;

  const hook = {
    roundsShown: 0, lastRound: 0, polls: 0, errors: [], networkErrors: 0, state: null,
    stopped: false,
  };
  window.cohortDashboard = hook;

  const COLORS = {
    blue: '#2f6fdd', orange: '#e07b24', green: '#1e8e5a', purple: '#7b61c9', grey: '#9aa5b1',
  };

  // ---- formatting ----------------------------------------------------------------------------
  const DASH = '\u2013';
  const isNum = (x) => typeof x === 'number' && Number.isFinite(x);

  function fmtBytes(n) {
    if (!isNum(n)) return DASH;
    const units = ['B', 'kB', 'MB', 'GB', 'TB'];  // decimal: the charts' ticks fall on round values
    let i = 0;
    while (Math.abs(n) >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
    const digits = i === 0 || Math.abs(n) >= 100 ? 0 : Math.abs(n) >= 10 ? 1 : 2;
    return `${Number(n.toFixed(digits))} ${units[i]}`;
  }
  const fmtRate = (n) => (isNum(n) ? `${fmtBytes(n)}/s` : DASH);
  const fmtPct = (x) => (isNum(x) ? `${(x * 100).toFixed(1)}%` : DASH);

  function fmtNum(x, digits = 0) {
    if (!isNum(x)) return DASH;
    return x.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
  }

  function fmtDuration(seconds) {
    if (!isNum(seconds)) return DASH;
    const s = Math.floor(seconds);
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    const pad = (v) => String(v).padStart(2, '0');
    return h > 0 ? `${h}:${pad(m)}:${pad(s % 60)}` : `${m}:${pad(s % 60)}`;
  }

  const $ = (id) => document.getElementById(id);
  function setText(id, text) { $(id).textContent = text; }

  // ---- errors and the status line --------------------------------------------------------------
  class RequestError extends Error {
    constructor(kind, message) { super(message); this.kind = kind; }  // kind: network | http | protocol
  }

  function recordError(message) {
    hook.errors.push(message);
    if (hook.errors.length > MAX_ERRORS_KEPT) hook.errors.shift();
  }

  function showStatusLine(text, cls) {
    const line = $('status-line');
    line.textContent = text;
    line.className = cls || '';
  }

  window.addEventListener('error', (event) => recordError(`uncaught: ${event.message}`));
  window.addEventListener('unhandledrejection', (event) => recordError(`unhandled: ${event.reason}`));

  async function getJson(path) {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), REQUEST_TIMEOUT_MS);
    let response;
    try {
      response = await fetch(path, { cache: 'no-store', signal: controller.signal });
    } catch (e) {
      throw new RequestError('network', `no reply from the server for ${path} (${e.message})`);
    } finally {
      clearTimeout(timer);
    }
    if (!response.ok) {
      let detail = '';
      try { detail = (await response.json()).error || ''; } catch (e) { /* a body that is not JSON */ }
      throw new RequestError('http', `${path}: HTTP ${response.status} ${detail}`.trim());
    }
    try {
      return await response.json();
    } catch (e) {
      throw new RequestError('protocol', `${path}: the reply is not JSON`);
    }
  }

  // ---- charts --------------------------------------------------------------------------------
  const charts = {};

  function baseOptions(yTick) {
    return {
      animation: false,
      responsive: true,
      maintainAspectRatio: false,
      normalized: true,
      spanGaps: true,
      parsing: { xAxisKey: 'x', yAxisKey: 'y' },
      interaction: { mode: 'nearest', axis: 'x', intersect: false },
      elements: {
        point: { radius: (ctx) => (ctx.dataset.data.length > 60 ? 0 : 2.5), hoverRadius: 4 },
        line: { borderWidth: 2, tension: 0.15 },
      },
      plugins: {
        legend: { position: 'top', align: 'end', labels: { boxWidth: 12, boxHeight: 12, padding: 10 } },
        tooltip: {
          callbacks: {
            title: (items) => (items.length ? `round ${items[0].parsed.x}` : ''),
            label: (item) => `${item.dataset.label}: ${yTick(item.parsed.y)}`,
          },
        },
      },
      scales: {
        // Rounds on a linear axis: ticks at round numbers, and rounds without a value (not
        // evaluated, say) are simply absent from a dataset.
        x: { type: 'linear', title: { display: true, text: 'round' },
             ticks: { precision: 0, maxRotation: 0, maxTicksLimit: 12 }, grid: { display: false } },
        y: { ticks: { callback: (value) => yTick(value), maxTicksLimit: 6 } },
      },
    };
  }

  function dataset(label, color, field, extra) {
    return Object.assign({ label, field, data: [], borderColor: color, backgroundColor: color }, extra);
  }

  function makeChart(id, type, datasets, yTick, tweak) {
    const options = baseOptions(yTick);
    if (tweak) tweak(options);
    charts[id] = new window.Chart($(id), { type, data: { datasets }, options });
  }

  function createCharts() {
    if (typeof window.Chart !== 'function') {
      recordError('Chart.js did not load from /static/chart.js');
      return;
    }
    const pct = (v) => (isNum(v) ? `${Number((v * 100).toFixed(1))}%` : DASH);
    const plain = (v) => (isNum(v) ? Number(v.toPrecision(3)).toString() : DASH);
    const secs = (v) => (isNum(v) ? `${Number(v.toPrecision(3))} s` : DASH);
    makeChart('chart-accuracy', 'line', [
      dataset('test accuracy', COLORS.blue, 'test_accuracy', { fill: false }),
    ], pct);
    makeChart('chart-loss', 'line', [
      dataset('train loss', COLORS.orange, 'train_loss'),
      dataset('test loss', COLORS.blue, 'test_loss'),
    ], plain);
    makeChart('chart-time', 'bar', [
      dataset('training', COLORS.blue, 'train_seconds'),
      dataset('communication', COLORS.orange, 'comm_seconds'),
    ], secs, (o) => {
      o.scales.x.stacked = true;
      o.scales.x.offset = true;  // whole bars at both ends
      o.scales.y.stacked = true;
      o.scales.y.beginAtZero = true;
      o.datasets = { bar: { categoryPercentage: 0.9, barPercentage: 0.95, maxBarThickness: 28 } };
    });
    makeChart('chart-bytes', 'line', [
      dataset('total', COLORS.purple, 'bytes'),
      dataset('uplink', COLORS.green, 'uplink_bytes'),
    ], fmtBytes, (o) => {
      o.scales.y.beginAtZero = true;
      o.scales.y.ticks.precision = 0;  // no fractions of a byte on an empty chart
    });
  }

  const shownRounds = [];  // the round numbers in the charts, oldest first

  // Appends rounds newer than the last one drawn; returns how many were added.
  function addRounds(rounds) {
    let added = 0;
    for (const r of rounds) {
      if (!r || !isNum(r.round) || r.round <= hook.lastRound) continue;
      for (const chart of Object.values(charts)) {
        for (const ds of chart.data.datasets) {
          if (isNum(r[ds.field])) ds.data.push({ x: r.round, y: r[ds.field] });
        }
      }
      shownRounds.push(r.round);
      hook.lastRound = r.round;
      added += 1;
    }
    if (added === 0) return 0;
    if (shownRounds.length > MAX_POINTS) {
      const cutoff = shownRounds[shownRounds.length - MAX_POINTS - 1];
      shownRounds.splice(0, shownRounds.length - MAX_POINTS);
      for (const chart of Object.values(charts)) {
        for (const ds of chart.data.datasets) ds.data = ds.data.filter((p) => p.x > cutoff);
      }
    }
    for (const chart of Object.values(charts)) chart.update('none');
    const accuracy = charts['chart-accuracy'];
    if (accuracy) {
      const measured = accuracy.data.datasets[0].data.length;
      setText('acc-note', measured === 0 ? 'not measured yet' : `${measured} evaluated rounds`);
    }
    hook.roundsShown = Object.keys(charts).length ? shownRounds.length : 0;
    return added;
  }

  async function pullRounds() {
    for (let page = 0; page < MAX_PAGES_PER_POLL; page += 1) {
      const since = hook.lastRound;
      const body = await getJson(`/api/v1/rounds?since=${since}`);
      if (!body || !Array.isArray(body.rounds) || !isNum(body.next)) {
        throw new RequestError('protocol', '/api/v1/rounds: the reply has no "rounds" list or "next"');
      }
      addRounds(body.rounds);
      if (body.rounds.length < 1000 || body.next <= since) return;
    }
  }

  // ---- status: header and tables ---------------------------------------------------------------
  function cell(text, cls) {
    const td = document.createElement('td');
    td.textContent = text;
    if (cls) td.className = cls;
    return td;
  }

  function badgeCell(state) {
    const td = cell('', 'state');
    const span = document.createElement('span');
    span.className = `badge ${state || ''}`;
    span.textContent = state || DASH;
    td.appendChild(span);
    return td;
  }

  function fillTable(id, rows, columns, emptyText) {
    const body = document.createElement('tbody');
    for (const row of rows) {
      const tr = document.createElement('tr');
      for (const column of columns) tr.appendChild(column(row));
      body.appendChild(tr);
    }
    if (rows.length === 0) {
      const tr = document.createElement('tr');
      const td = cell(emptyText, 'empty');
      td.colSpan = columns.length;
      tr.appendChild(td);
      body.appendChild(tr);
    }
    const table = $(id);
    table.replaceChild(body, table.tBodies[0]);
  }

  function renderHeader(s) {
    const state = $('h-state');
    state.textContent = s.state || DASH;
    state.className = `badge ${s.state || ''}`;
    setText('h-mode', s.mode || DASH);
    setText('h-model', s.model || DASH);
    const planned = isNum(s.rounds_planned) && s.rounds_planned > 0 ? ` / ${s.rounds_planned}` : '';
    setText('h-rounds', `${fmtNum(s.rounds_committed)}${planned}`);
    setText('h-failed', fmtNum(s.rounds_failed));
    const latest = s.latest || {};
    setText('h-accuracy', fmtPct(latest.test_accuracy));
    setText('h-loss', isNum(latest.test_loss) ? latest.test_loss.toFixed(4) : DASH);
    setText('h-clients', Array.isArray(s.clients) ? fmtNum(s.clients.length) : DASH);
    setText('h-uptime', fmtDuration(s.uptime_seconds));
    setText('h-source', [s.source, s.version].filter(Boolean).join(' ') || DASH);
    document.title = `Cohort: ${s.state || '?'}, round ${fmtNum(s.rounds_committed)}`;
  }

  function renderClients(clients) {
    const shown = clients.slice(0, MAX_CLIENT_ROWS);
    const unreachable = clients.filter((c) => c && c.state === 'unreachable').length;
    const parts = [`${clients.length} known`];
    if (unreachable > 0) parts.push(`${unreachable} unreachable`);
    if (shown.length < clients.length) parts.push(`first ${shown.length} shown`);
    setText('clients-note', parts.join(', '));
    const assigned = (c, key) => (c.assigned && isNum(c.assigned[key]) ? fmtNum(c.assigned[key]) : DASH);
    fillTable('clients-table', shown, [
      (c) => cell(c.name || DASH),
      (c) => badgeCell(c.state),
      (c) => cell(fmtNum(c.last_round)),
      (c) => cell(fmtNum(c.rounds)),
      (c) => cell(fmtRate(c.throughput_bytes_per_second)),
      (c) => cell(fmtNum(c.samples_per_second)),
      (c) => cell(assigned(c, 'batch_size')),
      (c) => cell(assigned(c, 'local_steps')),
    ], 'no clients yet');
  }

  function renderShards(shards) {
    fillTable('shards-table', shards, [
      (s) => cell(fmtNum(s.shard)),
      (s) => cell(fmtBytes(s.received_bytes)),
      (s) => cell(fmtBytes(s.sent_bytes)),
      (s) => cell(fmtBytes(s.resident_memory_bytes)),
      (s) => cell(fmtNum(s.tls_handshakes)),
      (s) => cell(fmtNum(s.records_dropped)),
    ], 'no shards yet');
  }

  function renderRefusals(refusals) {
    const rows = Object.entries(refusals || {})
      .filter(([, count]) => isNum(count))
      .sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
    const total = rows.reduce((sum, [, count]) => sum + count, 0);
    setText('refusals-total', rows.length ? `${fmtNum(total)} in all` : '');
    fillTable('refusals-table', rows, [
      ([reason]) => cell(reason),
      ([, count]) => cell(fmtNum(count)),
    ], 'none');
  }

  function renderStatus(s) {
    if (!s || typeof s !== 'object') {
      throw new RequestError('protocol', '/api/v1/status: the reply is not a JSON object');
    }
    hook.state = s.state || null;
    renderHeader(s);
    renderClients(Array.isArray(s.clients) ? s.clients : []);
    renderShards(Array.isArray(s.shards) ? s.shards : []);
    renderRefusals(s.refusals);
  }

  // ---- polling -------------------------------------------------------------------------------
  let finalRefresh = false;  // the state was terminal at the last poll: this poll is the last one
  let lastUpdated = null;     // the time of the last poll that got every reply

  function describe(error) {
    return error instanceof Error ? error.message : String(error);
  }

  async function poll() {
    hook.polls += 1;
    const problems = [];
    let networkOnly = true;
    for (const step of [async () => renderStatus(await getJson('/api/v1/status')), pullRounds]) {
      try {
        await step();
      } catch (e) {
        problems.push(describe(e));
        if (e instanceof RequestError && e.kind === 'network') {
          hook.networkErrors += 1;
        } else {
          networkOnly = false;
          recordError(describe(e));
        }
      }
    }
    const terminal = hook.state === 'finished' || hook.state === 'failed';
    const time = new Date().toLocaleTimeString('en-GB');
    if (finalRefresh) {
      hook.stopped = true;
      const how = hook.state === 'failed' ? 'failed' : 'finished';
      const tail = problems.length ? ` (last refresh: ${problems.join('; ')})` : '';
      showStatusLine(`The run ${how} at round ${hook.lastRound}; polling stopped at ${time}${tail}.`,
                     problems.length && !networkOnly ? 'error' : 'done');
      return;
    }
    if (problems.length) {
      const what = networkOnly ? 'the server does not answer' : [...new Set(problems)].join('; ');
      const shown = lastUpdated ? `; the figures shown are from ${lastUpdated}` : '';
      showStatusLine(`${time}: ${what}; retrying every ${POLL_MS / 1000} s${shown}`, 'error');
    } else {
      lastUpdated = time;
      showStatusLine(`Updated ${time}; ${hook.roundsShown} rounds shown; ` +
                     `refreshing every ${POLL_MS / 1000} s`);
    }
    finalRefresh = terminal;
    setTimeout(poll, POLL_MS);
  }

  function start() {
    try {
      createCharts();
    } catch (e) {
      recordError(`creating the charts: ${describe(e)}`);
    }
    poll();
  }

  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', start);
  } else {
    start();
  }
})();
