"""The console in a real headless Chromium against ``kairos dev`` (issue 16).

Given the local stack and a fake model server (``tests/support/browser.py``), a user signs in with the
dev token; creates a cron schedule in Europe/Berlin and sees its next fires with the spring DST change
marked; watches a webhook's run go queued → running → succeeded on the timeline without a reload (the
page reads only after the last sequence it drew); approves a parked tool call and sees the run finish;
answers a goal loop's question and sees its run finish; reads a failed run's diagnosis and its recovery
actions; gets not-found for an unknown run; and sees a value containing ``<script>`` as text. The first
load stays under 200 KB and draws the schedules page in under a second, and fits a phone's width.
Deployed, the page signs in with OIDC authorization code + PKCE against the issuer and keeps the token
out of the URL. Waiting is Playwright's auto-waiting ``expect``, never a sleep."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kairos import runtime
from kairos.local import apigw
from playwright.sync_api import expect

from tests.support.api import HANDLER, Api
from tests.support.browser import TOKEN, Model, Provider, Stack, keep, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def conversation(stack: Stack, agent: dict[str, Any], title: str) -> str:
    return str(stack.api("POST", "/v1/conversations", {"agent": agent, "title": title})["conversation"]["id"])


def test_sign_in_create_a_berlin_cron_schedule_and_see_the_spring_change_marked(page: Any, stack: Stack) -> None:
    sign_in(page, stack)
    expect(page.locator("#schedules-table")).to_be_visible()
    page.click("text=New schedule")
    page.fill("input[name=name]", "Monday briefing")
    page.fill("textarea[name=prompt]", "Brief me on the week")
    page.select_option("select[name=kind]", "cron")
    page.fill("input[name=cron]", "0 9 * * 1")
    page.fill("input[name=timezone]", "Europe/Berlin")
    page.click("#schedule-form button[type=submit]")

    fires = page.locator("#fires")
    expect(fires).to_be_visible()
    expect(fires.locator("tbody tr").first).to_contain_text("09:00:00")
    page.click("text=Show 100 fires")  # two years of Mondays: at least one spring change whatever today is
    expect(page.locator("#fires tbody tr")).to_have_count(100)
    spring = page.locator("#fires tr.dst", has_text="+01:00 → +02:00").first
    expect(spring).to_be_visible()
    expect(spring).to_contain_text(re.compile(r"\d{4}-03-\d\d 09:00:00 DST change \+01:00 → \+02:00"))
    expect(spring.locator("td").nth(1)).to_have_text("+02:00")  # the wall time stays 09:00, the offset moves
    spring.scroll_into_view_if_needed()
    keep(page, "console-fires-dst.png")

    page.click("#nav a[data-page=schedules]")
    expect(page.locator("#schedules-table")).to_contain_text("Monday briefing")
    expect(page.locator("#schedules-table")).to_contain_text("GMT+01:00")  # next fire in local time with offset
    keep(page, "console-schedules.png")


def test_a_webhook_run_is_followed_live_from_queued_to_succeeded(page: Any, stack: Stack, model: Model) -> None:
    conversation_id = conversation(stack, model.agent("slow"), "slow model")
    created = stack.api("POST", "/v1/schedules", {"conversation_id": conversation_id, "prompt": "Summarize the push",
                                                  "kind": "webhook", "name": "on push"})
    model.gate.clear()
    run_id = stack.hook(created["webhook"]["url"], {"ref": "main"})
    reads: list[tuple[int, int]] = []  # (after, limit) of every trace read

    def read(request: Any) -> None:
        if "/events" in request.url:
            query = parse_qs(urlsplit(request.url).query)
            reads.append((int(query["after"][0]), int(query["limit"][0])))

    page.on("request", read)
    sign_in(page, stack, f"#/runs/{run_id}")
    page.evaluate("window.__sameDocument = true")

    timeline = page.locator("#timeline")
    expect(timeline.locator('[data-type="run.queued"]')).to_be_visible()  # queued: the trace's first event
    expect(page.locator("#run-state")).to_have_text("running")  # the model holds the call
    expect(timeline.locator('[data-type="run.claimed"]')).to_be_visible()
    expect(timeline.locator('[data-type="step.started"]')).to_contain_text("running")
    model.gate.set()
    expect(page.locator("#run-state")).to_have_text("succeeded")
    expect(timeline.locator('[data-type="run.succeeded"]')).to_be_visible()
    expect(page.locator("#output-text")).to_have_text("Good morning from the fake model.")
    assert page.evaluate("window.__sameDocument") is True  # no reload
    # Following reads after the last drawn sequence: the cursor only moves forward, the trace is read
    # once; besides, the open step's own row alone (limit 1) is re-read for its folded progress.
    pages = [after for after, limit in reads if limit != 1]
    assert pages[0] == 0 and pages == sorted(pages) and pages.count(0) == 1, reads
    started = int(timeline.locator('[data-type="step.started"]').get_attribute("data-seqs").split()[0])
    assert {after for after, limit in reads if limit == 1} <= {started - 1}, reads
    rows = [[int(n) for n in r.split()] for r in timeline.locator("[data-seqs]").evaluate_all(
        "rows => rows.map(r => r.dataset.seqs)")]
    drawn = [n for r in rows for n in r]  # a step's row holds its started and finished events
    assert len(drawn) == len(set(drawn)) and drawn[0] == 1, rows  # each event drawn once
    assert [r[0] for r in rows] == sorted(r[0] for r in rows), rows  # rows in server order
    keep(page, "console-run.png")


def test_approving_a_parked_tool_call_lets_the_run_finish(page: Any, stack: Stack, model: Model) -> None:
    conversation_id = conversation(stack, model.agent("tool", tools=["http"]), "tool agent")
    run_id = stack.api("POST", f"/v1/conversations/{conversation_id}/messages", {"content": "post order 42"})["run_id"]
    sign_in(page, stack, f"#/runs/{run_id}")
    expect(page.locator("#run-state")).to_have_text("awaiting_approval")
    page.locator("#timeline [data-type='approval.waiting'] a").click()

    row = page.locator("#approvals-table tr", has_text="http_post")
    expect(row).to_contain_text(run_id[:8])
    expect(row).to_contain_text("order")  # the bounded preview of the arguments
    row.get_by_role("button", name="Approve").click()
    expect(page.locator("#toast")).to_contain_text("Approved")
    expect(page.locator("#approvals-table")).not_to_contain_text(run_id[:8])

    page.goto(f"{stack.console}#/runs/{run_id}")
    expect(page.locator("#run-state")).to_have_text("succeeded")
    expect(page.locator("#timeline [data-type='approval.approved']")).to_be_visible()
    expect(page.locator("#output-text")).to_have_text("Posted.")
    assert len(model.hooks) == 1  # the approved call was applied once


def test_answering_a_goal_loops_question_lets_its_run_finish(page: Any, stack: Stack, model: Model) -> None:
    conversation_id = conversation(stack, model.agent("goal"), "goal loop")
    now = datetime.now(UTC)
    loop = stack.api("POST", "/v1/loops", {  # anchored so that its first fire is due two seconds from now
        "conversation_id": conversation_id, "prompt": "Tidy the backlog", "interval_seconds": 300,
        "starts_at": (now - timedelta(seconds=298)).isoformat(), "goal": {"outcome": "No stale issues"},
        "ends_at": (now + timedelta(days=7)).isoformat(), "max_occurrences": 3})["schedule"]
    sign_in(page, stack, "#/approvals")

    card = page.locator("#input-requests li", has_text="Close the 3 stale issues?")
    expect(card).to_be_visible()  # the loop fired on the next tick and its run parked on the question
    [waiting] = stack.api("GET", "/v1/input-requests?state=pending")["input_requests"]
    assert stack.api("GET", f"/v1/runs/{waiting['run_id']}")["run"]["state"] == "awaiting_input"
    card.locator("textarea").fill("Yes, close them")
    card.get_by_role("button", name="Answer").click()
    expect(page.locator("#toast")).to_contain_text("Answered")

    page.goto(f"{stack.console}#/runs/{waiting['run_id']}")
    expect(page.locator("#run-state")).to_have_text("succeeded")
    expect(page.locator("#timeline [data-type='input.answered']")).to_be_visible()
    assert stack.api("GET", f"/v1/loops/{loop['id']}")["schedule"]["status"] == "completed"


def test_a_failed_run_shows_its_diagnosis_and_recovery_actions(page: Any, stack: Stack, model: Model) -> None:
    conversation_id = conversation(stack, model.agent("fail"), "refused key")
    created = stack.api("POST", "/v1/schedules", {"conversation_id": conversation_id, "prompt": "Summarize",
                                                  "kind": "webhook", "name": "failing hook"})
    run_id = stack.hook(created["webhook"]["url"], {"n": 1})
    sign_in(page, stack, f"#/runs/{run_id}")
    expect(page.locator("#run-state")).to_have_text("failed")
    diagnosis = page.locator("#diagnosis")
    expected = stack.api("GET", f"/v1/runs/{run_id}")["run"]["diagnosis"]
    expect(diagnosis.locator(".summary")).to_have_text(expected["summary"])
    expect(diagnosis).to_contain_text(expected["reason_code"])
    expect(page.locator("#timeline [data-type='run.failed']")).to_be_visible()
    buttons = diagnosis.locator("button[data-action]")
    expect(buttons).to_have_count(len(expected["recovery_actions"]))
    assert "retry_run" in expected["recovery_actions"], expected  # a refused model call is retry-safe

    diagnosis.locator("button[data-action=retry_run]").click()  # the recovery action is a button that acts
    expect(page).not_to_have_url(re.compile(re.escape(run_id)))
    retried = page.url.rsplit("/", 1)[-1]
    again = stack.api("GET", f"/v1/runs/{retried}")["run"]
    assert (again["schedule_id"], again["source"]) == (created["schedule"]["id"], "manual"), again
    expect(page.locator("#run-state")).to_have_text("failed")  # the same refusing model, a new run


def test_an_unknown_run_id_shows_not_found(page: Any, stack: Stack) -> None:
    sign_in(page, stack, f"#/runs/{uuid.uuid4()}")
    expect(page.locator("#not-found")).to_contain_text("Run not found")


def test_a_value_containing_script_renders_as_text(page: Any, stack: Stack, model: Model) -> None:
    hostile = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
    conversation_id = conversation(stack, model.agent("ok"), hostile)
    stack.api("POST", "/v1/schedules", {"conversation_id": conversation_id, "prompt": hostile, "name": hostile,
                                        "cron": "0 8 * * *", "timezone": "Europe/Berlin"})
    sign_in(page, stack)
    expect(page.locator("#schedules-table")).to_contain_text(hostile)
    page.locator("#schedules-table a", has_text="<script>").first.click()
    expect(page.locator("h1")).to_have_text(hostile)
    expect(page.locator(".facts")).to_contain_text(hostile)
    assert page.evaluate("window.__pwned") is None
    assert page.locator("main img, main script").count() == 0


# Set in the page before any of its scripts: when the schedules table first exists, in ms since navigation.
DRAWN_AT = """
new MutationObserver((_, observer) => {
  if (document.getElementById("schedules-table")) { window.__drawnAt = performance.now(); observer.disconnect(); }
}).observe(document, {childList: true, subtree: true});
"""


def test_the_first_load_is_under_200_kb_and_draws_the_schedules_page_within_a_second(
        browser: Any, stack: Stack) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(f"sessionStorage.setItem('kairos.token', JSON.stringify({{token: '{TOKEN}'}}))")
    context.add_init_script(DRAWN_AT)
    page = context.new_page()
    sizes: dict[str, int] = {}
    page.on("response", lambda r: sizes.__setitem__(r.url, len(r.body()) + sum(len(k) + len(v) for k, v in
                                                                               r.headers.items())))
    try:
        page.goto(stack.console)
        expect(page.locator("#schedules-table")).to_be_visible()
        page.wait_for_load_state("networkidle")
        drawn_ms = page.evaluate("window.__drawnAt")
        transferred = page.evaluate("performance.getEntriesByType('resource').concat(performance.getEntriesByType("
                                    "'navigation')).reduce((sum, e) => sum + e.transferSize, 0)")
        total = sum(sizes.values())
        print(f"\nconsole first load: {total / 1024:.1f} KB in {len(sizes)} responses (Performance API: "
              f"{transferred / 1024:.1f} KB); schedules drawn {drawn_ms:.0f} ms after navigation")
        assert total < 200 * 1024 and transferred < 200 * 1024, sizes
        assert drawn_ms < 1000, drawn_ms
        assert any(url.endswith("/v1/schedules") for url in sizes)
    finally:
        context.close()


def test_the_schedules_page_fits_a_phone_width_screen(browser: Any, stack: Stack) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    context.add_init_script(f"sessionStorage.setItem('kairos.token', JSON.stringify({{token: '{TOKEN}'}}))")
    page = context.new_page()
    try:
        page.goto(stack.console)
        expect(page.locator("#schedules-table")).to_be_visible()
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, overflow
        keep(page, "console-phone.png")
    finally:
        context.close()


def test_the_schedule_controls_pause_resume_edit_backfill_and_rotate_the_token(
        page: Any, stack: Stack, model: Model) -> None:
    conversation_id = conversation(stack, model.agent("ok"), "controls")
    cron = stack.api("POST", "/v1/schedules", {"conversation_id": conversation_id, "prompt": "Daily digest",
                                               "name": "digest", "cron": "30 6 * * *", "timezone": "Europe/Berlin"})
    hook = stack.api("POST", "/v1/schedules", {"conversation_id": conversation_id, "prompt": "On push",
                                               "kind": "webhook", "name": "push hook"})
    sign_in(page, stack, f"#/schedules/{cron['schedule']['id']}")
    page.get_by_role("button", name="Pause").click()
    expect(page.locator(".head .badge")).to_have_text("paused")
    page.get_by_role("button", name="Resume").click()
    expect(page.locator(".head .badge")).to_have_text("active")

    revision = int(page.locator(".facts dd").nth(2).text_content() or "0")
    page.get_by_role("link", name="Edit").click()
    page.fill("textarea[name=prompt]", "Daily digest, shorter")
    page.click("#schedule-form button[type=submit]")
    expect(page.locator(".facts")).to_contain_text("Daily digest, shorter")
    expect(page.locator(".facts dd").nth(2)).to_have_text(str(revision + 1))  # a new revision

    page.locator("summary", has_text="Backfill").click()
    page.fill("input[name=from]", "2026-01-01T00:00")
    page.fill("input[name=until]", "2026-01-02T00:00")
    page.get_by_role("button", name="Backfill", exact=True).click()
    expect(page.locator("#toast")).to_contain_text("backfill occurrences")  # none before the schedule existed

    page.goto(f"{stack.console}#/schedules/{hook['schedule']['id']}")
    page.get_by_role("button", name="Rotate token").click()
    shown = page.locator("#webhook-url code")
    expect(shown).to_contain_text("/v1/hooks/")
    new_url = shown.text_content() or ""
    assert new_url != hook["webhook"]["url"]
    assert stack.hook(new_url, {"n": 1}) and stack.hook(hook["webhook"]["url"], {"n": 2})  # the old one overlaps
    page.reload()
    expect(page.locator(".facts")).to_be_visible()
    expect(page.locator("#webhook-url")).to_have_count(0)  # shown once


def test_deployed_the_console_signs_in_with_oidc_pkce_and_keeps_the_token_out_of_the_url(
        page: Any, api: Api, provider: Provider, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the API as deployed (JWT mode: the authorizer's claims; here a stand-in that trusts the
    # provider's one token) with the console configured for that issuer and client.
    monkeypatch.setenv("KAIROS_AUTH", "jwt")
    monkeypatch.setenv("KAIROS_CONSOLE_ISSUER", provider.issuer)
    monkeypatch.setenv("KAIROS_CONSOLE_CLIENT_ID", provider.client_id)
    runtime.reset()

    def claims(headers: Mapping[str, str]) -> dict[str, str] | None:
        value = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
        return {"sub": "carol"} if value == f"Bearer {provider.access_token}" else None

    server = apigw.ApiGatewayServer(HANDLER, claims=claims).start()
    try:
        page.goto(f"{server.url}/console/#/schedules")
        page.get_by_role("button", name="Sign in").click()  # to the provider and back with a code
        expect(page.locator("#schedules-table")).to_have_text("No schedules yet.")  # carol's (empty) list
        assert len(provider.exchanged) == 1  # the code was exchanged with the verifier of its challenge
        assert "code=" not in page.url and provider.access_token not in page.url, page.url
        assert page.url.endswith("/console/#/schedules"), page.url
        assert provider.access_token in page.evaluate("sessionStorage.getItem('kairos.token')")
        assert page.evaluate("localStorage.length") == 0
    finally:
        server.stop()


def test_usage_status_inbox_and_runs_pages_draw_from_the_api(page: Any, stack: Stack, model: Model) -> None:
    conversation_id = conversation(stack, model.agent("ok"), "usage")
    run_id = stack.api("POST", f"/v1/conversations/{conversation_id}/messages", {"content": "hi"})["run_id"]
    sign_in(page, stack, f"#/runs/{run_id}")
    expect(page.locator("#run-state")).to_have_text("succeeded")  # one model call: 21 + 7 tokens today

    page.goto(f"{stack.console}#/usage?days=7")
    chart = page.locator("#usage-chart")
    expect(chart.locator("g")).to_have_count(7)  # one bar group per UTC day of the window
    heights = chart.locator("g").last.locator("rect").evaluate_all("rs => rs.map(r => +r.getAttribute('height'))")
    assert all(h > 0 for h in heights), heights  # today's input and output bars are drawn

    page.click("#nav a[data-page=status]")
    status = stack.api("GET", "/v1/status")["status"]
    expect(page.locator("#due-backlog .value")).to_have_text(str(status["due_backlog"]))
    expect(page.locator("#dlq-depth .value")).to_have_text("n/a")  # no RUN_DLQ_URL locally

    page.click("#nav a[data-page=inbox]")
    expect(page.locator("#inbox")).to_be_visible()

    page.click("#nav a[data-page=runs]")
    expect(page.locator("#runs-table")).to_be_visible()
    page.select_option("#filter-source", "chat")
    page.click("#run-filters button[type=submit]")
    expect(page).to_have_url(re.compile(r"#/runs\?source=chat$"))
    expect(page.locator("#runs-table")).to_contain_text(run_id[:8])
    sources = page.locator("#runs-table tbody td:nth-child(3)")
    assert set(sources.all_text_contents()) == {"chat"}
