"""The fact-first suite: an agent's working sessions, what a model extracts from each step, and
questions that one extracted fact or procedure answers.

Each question's answer is the text of one SEMANTIC or PROCEDURAL node; a recall meets the
suite when that node ranks first, above the raw step it was extracted from and everything
else. The test model (`SuiteLLM`) extracts exactly the facts and procedures written beside
each step, as a good model would; the sessions are deploys, debugging, configuration, people's
preferences and corrections over time. `tests/recall/test_fact_first.py` requires hit@1 >= 0.9;
`scripts/eval_recall.py` reports MRR and hit@1.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mnemo
from mnemo import text as _text
from tests.fakes import FakeLLM


@dataclass(frozen=True, slots=True)
class Procedure:
    intent: str
    condition: str
    instruction: str


@dataclass(frozen=True, slots=True)
class Told:
    """One step of a session and what a model extracts from it."""

    observation: str
    action: str
    facts: tuple[str, ...] = ()
    procedures: tuple[Procedure, ...] = ()


@dataclass(frozen=True, slots=True)
class Session:
    goal: str
    steps: tuple[Told, ...]


@dataclass(frozen=True, slots=True)
class Case:
    """A question and the text of the one fact or procedure that answers it."""

    question: str
    answer: str


P = Procedure
SESSIONS: tuple[Session, ...] = (
    Session("Deploy the blog behind nginx", (
        Told("nginx returns 502 Bad Gateway for every page of the blog.",
             "Read /var/log/nginx/error.log: connect() failed, upstream 127.0.0.1:8000."),
        Told("gunicorn was started by hand and listens on port 8001, not 8000.",
             "Bind gunicorn to 127.0.0.1:8000 in the systemd unit and restart it.",
             facts=("Gunicorn for the blog listens on 127.0.0.1:8000.",)),
        Told("The blog loads again; static files return 404.",
             "Point the nginx location /static/ at /srv/blog/static and reload nginx.",
             facts=("nginx serves the blog's static files from /srv/blog/static.",)),
        Told("systemctl status blog shows the unit restarted twice overnight.",
             "Raise gunicorn's worker timeout to 60 seconds; the report page is slow.",
             facts=("Gunicorn's worker timeout for the blog is 60 seconds.",)),
        Told("After a deploy the old CSS is still served to users.",
             "Add a content hash to static file names with the manifest storage.",
             procedures=(P("bust cached static files",
                           "when users see old CSS or JavaScript after a deploy",
                           "Build static files with hashed names (ManifestStaticFilesStorage) "
                           "and run collectstatic before restarting gunicorn."),)),
    )),
    Session("Fix the flaky upload test", (
        Told("test_upload_large fails about one run in five on CI, never locally.",
             "Rerun it 20 times with pytest --count=20 on the CI runner."),
        Told("It fails when the temporary bucket from the previous test still exists.",
             "Read the fixture: the bucket name is fixed, not unique per test.",
             facts=("The upload test was flaky because every test reused one fixed "
                    "temporary bucket name.",)),
        Told("With a uuid in the bucket name the test passed 50 runs in a row.",
             "Commit the fixture change and remove the retry decorator.",
             facts=("The upload test's fixture now names each temporary bucket with a uuid.",)),
        Told("The CI runner has 2 GB of memory; the 1 GB upload test used 1.6 GB.",
             "Stream the upload in 8 MB chunks instead of reading the file at once.",
             facts=("The CI runner has 2 GB of memory.",
                    "Uploads are streamed in 8 MB chunks.")),
        Told("A test hangs when MinIO is not running.",
             "Add a 5 second connect timeout to the S3 client in tests.",
             procedures=(P("debug a hanging storage test",
                           "when a storage test hangs on CI",
                           "Check that the MinIO container is up with docker ps, then give "
                           "the S3 client a 5 second connect timeout."),)),
    )),
    Session("Set up the production database", (
        Told("Postgres refuses connections above 100 clients during the evening peak.",
             "Put pgbouncer in front of it in transaction mode with a pool of 20.",
             facts=("Production Postgres accepts at most 100 client connections.",
                    "pgbouncer runs in transaction mode with a pool size of 20.")),
        Told("The staging database host is db-stage-1.internal, port 5432.",
             "Add it to the team's .pgpass.",
             facts=("The staging database host is db-stage-1.internal.",)),
        Told("Nightly backups run pg_dump at 02:00 UTC to the s3://acme-backups bucket.",
             "Check that last night's dump restores into a scratch database.",
             facts=("Nightly database backups run at 02:00 UTC into s3://acme-backups.",)),
        Told("A restore of the 40 GB dump took 25 minutes with pg_restore -j 4.",
             "Write the restore steps into the runbook.",
             procedures=(P("restore the production database from backup",
                           "when the production database must be restored",
                           "Download the latest dump from s3://acme-backups and run "
                           "pg_restore -j 4 into a fresh database, then switch the app's "
                           "DATABASE_URL."),)),
        Told("Slow query log: the orders report scans the whole orders table.",
             "Create an index on orders (customer_id, created_at).",
             facts=("The orders table has an index on (customer_id, created_at) for the "
                    "orders report.",)),
    )),
    Session("Onboard with the team", (
        Told("Priya says she reviews pull requests only in the morning, before 11.",
             "Note it and send review requests early.",
             facts=("Priya reviews pull requests only in the morning, before 11:00.",)),
        Told("Marco asks that every PR description includes a rollback plan.",
             "Add a rollback section to the PR template.",
             facts=("Marco wants every pull request description to include a rollback "
                    "plan.",)),
        Told("The team deploys on Tuesdays and Thursdays, never on Fridays.",
             "Put the deploy days in the team calendar.",
             facts=("The team deploys only on Tuesdays and Thursdays, never on Fridays.",)),
        Told("Lena is the on-call engineer this week; her handle is @lena-ops.",
             "Page her through PagerDuty for production incidents.",
             facts=("Lena (@lena-ops) is the on-call engineer this week.",)),
        Told("Priya prefers tabs of 4 spaces in Python and black's defaults otherwise.",
             "Set the editor config accordingly.",
             facts=("The team formats Python with black's default settings.",)),
        Told("Marco dislikes long standups; he wants them under 10 minutes.",
             "Keep standup updates to one sentence each.",
             facts=("Marco wants standups to last under 10 minutes.",)),
    )),
    Session("Configure the API service", (
        Told("The API reads its settings from environment variables with the prefix ACME_.",
             "Document ACME_DATABASE_URL and ACME_REDIS_URL in the README.",
             facts=("The API service reads settings from environment variables prefixed "
                    "ACME_.",)),
        Told("Rate limiting: clients get 429 above 100 requests per minute.",
             "Raise the limit for the partner key to 600 requests per minute.",
             facts=("The API rate limit is 100 requests per minute per client; the partner "
                    "key allows 600.",)),
        Told("Redis runs on cache-1.internal and keeps sessions for 24 hours.",
             "Set the session TTL to 86400 seconds in settings.",
             facts=("User sessions are kept in Redis on cache-1.internal for 24 hours.",)),
        Told("Password reset emails are sent through Postmark and expire after one hour.",
             "Link the Postmark template id in the config.",
             facts=("Password reset emails expire after one hour.",
                    "Transactional email is sent through Postmark.")),
        Told("CORS errors from the admin app on admin.acme.io.",
             "Add https://admin.acme.io to CORS_ALLOWED_ORIGINS.",
             facts=("CORS_ALLOWED_ORIGINS includes https://admin.acme.io for the admin "
                    "app.",)),
        Told("The feature flag new_checkout is read from LaunchDarkly at startup.",
             "Restart the API after flipping it.",
             facts=("The new_checkout feature flag only takes effect after an API "
                    "restart.",)),
    )),
    Session("Debug the memory leak in the worker", (
        Told("The celery worker grows to 3 GB after a day and gets OOM-killed.",
             "Profile it with tracemalloc over an hour of jobs."),
        Told("tracemalloc shows the PDF renderer caching every font it loads.",
             "Set max_tasks_per_child=200 so workers are recycled.",
             facts=("The celery worker leaked memory because the PDF renderer caches every "
                    "font it loads.",
                    "Celery workers are recycled after 200 tasks (max_tasks_per_child).")),
        Told("Jobs retried forever after the SMTP server went down.",
             "Cap retries at 5 with exponential backoff.",
             facts=("Celery tasks retry at most 5 times with exponential backoff.",)),
        Told("The worker dashboard is Flower on port 5555 behind the VPN.",
             "Bookmark it.",
             facts=("Flower, the celery dashboard, runs on port 5555 behind the VPN.",)),
        Told("A worker stuck on a job blocks the queue.",
             "Kill it with celery control terminate and requeue the job.",
             procedures=(P("unstick the celery queue",
                           "when a celery worker is stuck on one job and the queue stops",
                           "Find the task id in Flower, run celery control terminate "
                           "TASK_ID, then requeue the job."),)),
    )),
    Session("Rotate secrets and certificates", (
        Told("certbot says the certificate for acme.io expires in 3 days.",
             "Run certbot renew and reload nginx.",
             procedures=(P("renew the TLS certificate",
                           "when the TLS certificate is about to expire",
                           "Run certbot renew --cert-name acme.io, then systemctl reload "
                           "nginx."),)),
        Told("The renewal cron job had been disabled since the server move.",
             "Re-enable the certbot timer with systemctl enable --now certbot.timer.",
             facts=("The certbot timer renews the acme.io certificate automatically.",)),
        Told("The AWS access key of the deploy user is 400 days old.",
             "Create a new key, update the CI secret, delete the old key.",
             procedures=(P("rotate the deploy user's AWS key",
                           "when the deploy user's AWS access key is old",
                           "Create a new access key in IAM, update AWS_ACCESS_KEY_ID and "
                           "AWS_SECRET_ACCESS_KEY in the CI secrets, then delete the old "
                           "key."),)),
        Told("Secrets live in 1Password, vault 'Infra'.",
             "Move the Postmark token there.",
             facts=("The team keeps infrastructure secrets in the 1Password vault "
                    "'Infra'.",)),
    )),
    Session("Move the staging environment", (
        Told("Staging moved to the new cluster this week.",
             "Update the DNS record staging.acme.io."),
        Told("The staging database host is now db-stage-2.internal after the move.",
             "Update .pgpass and the staging env file.",
             facts=("The staging database host is db-stage-2.internal.",)),
        Told("The team now deploys on Wednesdays too, after the retro.",
             "Update the calendar.",
             facts=("The team deploys only on Tuesdays, Wednesdays and Thursdays, never "
                    "on Fridays.",)),
        Told("The new cluster runs Kubernetes 1.29 on three nodes.",
             "Note the version in the infra docs.",
             facts=("The staging cluster runs Kubernetes 1.29 on three nodes.",)),
        Told("Lena handed on-call over to Tom (@tom-sre) on Monday.",
             "Update the PagerDuty schedule.",
             facts=("Tom (@tom-sre) is the on-call engineer this week.",)),
        Told("kubectl apply fails: the image pull secret is missing in namespace staging.",
             "Create the regcred secret in the staging namespace and redeploy.",
             procedures=(P("fix ImagePullBackOff in staging",
                           "when pods in the staging namespace fail with ImagePullBackOff",
                           "Create the regcred docker-registry secret in the staging "
                           "namespace and redeploy."),)),
    )),
    Session("Investigate slow page loads", (
        Told("The product page takes 4 seconds; the profiler shows 120 SQL queries.",
             "Add select_related('category') to the product query.",
             facts=("The product page was slow because of an N+1 query on categories.",)),
        Told("After the fix the page renders in 300 ms with 6 queries.",
             "Add a test that asserts the query count.",
             facts=("A test asserts that the product page runs at most 6 SQL queries.",)),
        Told("The CDN is Cloudflare; cached pages live 5 minutes.",
             "Purge the cache after releases.",
             facts=("Cloudflare caches pages for 5 minutes.",)),
        Told("Lighthouse score on mobile is 62 because of an unoptimised hero image.",
             "Serve the hero image as WebP at 1200px wide.",
             facts=("The hero image is served as 1200px-wide WebP.",)),
        Told("The search endpoint times out with more than 10,000 results.",
             "Paginate search results at 50 per page.",
             facts=("Search results are paginated at 50 per page.",)),
    )),
)

# What the model answers to the "contradiction" task: (existing fact, new fact) pairs where the
# new one ends the old one.
CORRECTIONS: frozenset[tuple[str, str]] = frozenset({
    ("The staging database host is db-stage-1.internal.",
     "The staging database host is db-stage-2.internal."),
    ("The team deploys only on Tuesdays and Thursdays, never on Fridays.",
     "The team deploys only on Tuesdays, Wednesdays and Thursdays, never on Fridays."),
    ("Lena (@lena-ops) is the on-call engineer this week.",
     "Tom (@tom-sre) is the on-call engineer this week."),
})

CASES: tuple[Case, ...] = (
    Case("which port does gunicorn use?", "Gunicorn for the blog listens on 127.0.0.1:8000."),
    Case("where does nginx serve static files from?",
         "nginx serves the blog's static files from /srv/blog/static."),
    Case("what is gunicorn's worker timeout?",
         "Gunicorn's worker timeout for the blog is 60 seconds."),
    Case("users see old CSS after a deploy, what should I do?",
         "Build static files with hashed names (ManifestStaticFilesStorage) and run "
         "collectstatic before restarting gunicorn."),
    Case("why was the upload test flaky?",
         "The upload test was flaky because every test reused one fixed temporary bucket name."),
    Case("how are temporary buckets named in the upload test?",
         "The upload test's fixture now names each temporary bucket with a uuid."),
    Case("how much memory does the CI runner have?", "The CI runner has 2 GB of memory."),
    Case("what chunk size do uploads use?", "Uploads are streamed in 8 MB chunks."),
    Case("a storage test hangs on CI, how do I debug it?",
         "Check that the MinIO container is up with docker ps, then give the S3 client a 5 "
         "second connect timeout."),
    Case("how many connections does production postgres accept?",
         "Production Postgres accepts at most 100 client connections."),
    Case("what pool size does pgbouncer use?",
         "pgbouncer runs in transaction mode with a pool size of 20."),
    Case("what is the staging database host?", "The staging database host is db-stage-2.internal."),
    Case("when do the nightly backups run?",
         "Nightly database backups run at 02:00 UTC into s3://acme-backups."),
    Case("how do I restore the production database?",
         "Download the latest dump from s3://acme-backups and run pg_restore -j 4 into a fresh "
         "database, then switch the app's DATABASE_URL."),
    Case("which index speeds up the orders report?",
         "The orders table has an index on (customer_id, created_at) for the orders report."),
    Case("when does Priya review pull requests?",
         "Priya reviews pull requests only in the morning, before 11:00."),
    Case("what does Marco want in a PR description?",
         "Marco wants every pull request description to include a rollback plan."),
    Case("which days does the team deploy?",
         "The team deploys only on Tuesdays, Wednesdays and Thursdays, never on Fridays."),
    Case("can we deploy on a Friday?",
         "The team deploys only on Tuesdays, Wednesdays and Thursdays, never on Fridays."),
    Case("who is on call this week?", "Tom (@tom-sre) is the on-call engineer this week."),
    Case("how does the team format Python code?",
         "The team formats Python with black's default settings."),
    Case("how long should standups be?", "Marco wants standups to last under 10 minutes."),
    Case("which prefix do the API's environment variables use?",
         "The API service reads settings from environment variables prefixed ACME_."),
    Case("what is the API rate limit?",
         "The API rate limit is 100 requests per minute per client; the partner key allows 600."),
    Case("how long are user sessions kept?",
         "User sessions are kept in Redis on cache-1.internal for 24 hours."),
    Case("when do password reset emails expire?", "Password reset emails expire after one hour."),
    Case("which service sends our transactional email?",
         "Transactional email is sent through Postmark."),
    Case("the admin app gets CORS errors, which origin is allowed?",
         "CORS_ALLOWED_ORIGINS includes https://admin.acme.io for the admin app."),
    Case("I flipped the new_checkout flag and nothing changed, why?",
         "The new_checkout feature flag only takes effect after an API restart."),
    Case("why did the celery worker leak memory?",
         "The celery worker leaked memory because the PDF renderer caches every font it loads."),
    Case("after how many tasks are celery workers recycled?",
         "Celery workers are recycled after 200 tasks (max_tasks_per_child)."),
    Case("how many times do celery tasks retry?",
         "Celery tasks retry at most 5 times with exponential backoff."),
    Case("where is the celery dashboard?",
         "Flower, the celery dashboard, runs on port 5555 behind the VPN."),
    Case("the celery queue is stuck on one job, what do I do?",
         "Find the task id in Flower, run celery control terminate TASK_ID, then requeue the "
         "job."),
    Case("how do I renew the TLS certificate?",
         "Run certbot renew --cert-name acme.io, then systemctl reload nginx."),
    Case("does the acme.io certificate renew automatically?",
         "The certbot timer renews the acme.io certificate automatically."),
    Case("how do I rotate the deploy user's AWS access key?",
         "Create a new access key in IAM, update AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in "
         "the CI secrets, then delete the old key."),
    Case("where are infrastructure secrets kept?",
         "The team keeps infrastructure secrets in the 1Password vault 'Infra'."),
    Case("which Kubernetes version does staging run?",
         "The staging cluster runs Kubernetes 1.29 on three nodes."),
    Case("pods in staging fail with ImagePullBackOff, how do I fix it?",
         "Create the regcred docker-registry secret in the staging namespace and redeploy."),
    Case("why was the product page slow?",
         "The product page was slow because of an N+1 query on categories."),
    Case("how many SQL queries may the product page run?",
         "A test asserts that the product page runs at most 6 SQL queries."),
    Case("how long does Cloudflare cache pages?", "Cloudflare caches pages for 5 minutes."),
    Case("what format is the hero image served in?",
         "The hero image is served as 1200px-wide WebP."),
    Case("how many search results are on a page?", "Search results are paginated at 50 per page."),
    Case("what is the on-call engineer's handle?",
         "Tom (@tom-sre) is the on-call engineer this week."),
)


class SuiteLLM(FakeLLM):
    """The test model: `FakeLLM`, whose "semantic" and "procedural" tasks extract exactly the
    facts and procedures `SESSIONS` writes beside each step (each from its own step), and
    whose "contradiction" task knows `corrections` (`CORRECTIONS`)."""

    def __init__(self, sessions: Sequence[Session] = SESSIONS,
                 corrections: frozenset[tuple[str, str]] = CORRECTIONS) -> None:
        super().__init__()
        self._told = {t.observation: t for s in sessions for t in s.steps}
        self._corrections = corrections

    def _answer(self, task: str, inputs: dict[str, Any]) -> mnemo.LLMResponse:
        if task == "contradiction":
            ended = [p["index"] for p in inputs.get("pairs", [])
                     if (str(p["existing"]), str(p["new"])) in self._corrections]
            return mnemo.LLMResponse(data={"contradicted": ended},
                                     usage=mnemo.Usage(input_tokens=1, output_tokens=1))
        if task not in ("semantic", "procedural"):
            return super()._answer(task, inputs)
        steps = [(s["index"], self._told.get(s["observation"])) for s in inputs.get("steps", [])]
        if task == "semantic":
            data: dict[str, Any] = {"facts": [
                {"proposition": fact, "concepts": _text.concepts(fact, limit=3),
                 "confidence": 0.9, "steps": [index]}
                for index, told in steps if told is not None for fact in told.facts
            ]}
        else:
            data = {"instructions": [
                {"intent": p.intent, "condition": p.condition, "instruction": p.instruction,
                 "expected_outcome": "it works", "steps": [index]}
                for index, told in steps if told is not None for p in told.procedures
            ]}
        return mnemo.LLMResponse(data=data, usage=mnemo.Usage(input_tokens=1, output_tokens=1))


@dataclass(slots=True)
class Report:
    """Each case's rank of its answer (None: not in the top k), with MRR and hit@1."""

    ranks: list[tuple[Case, int | None, list[str]]] = field(default_factory=list)
    # Each question's results as (type, text, score), best first.
    rankings: list[list[tuple[str, str, float]]] = field(default_factory=list)

    @property
    def hit_at_1(self) -> float:
        return statistics.fmean(rank == 1 for _, rank, _ in self.ranks)

    @property
    def mrr(self) -> float:
        return statistics.fmean(1 / rank if rank else 0.0 for _, rank, _ in self.ranks)


REPO = "agent"


async def remember(mem: mnemo.Memory, sessions: Sequence[Session] = SESSIONS, *,
                   repo: str = REPO) -> None:
    """Opens `repo` and runs and commits every session of `sessions`, in order."""
    await mem.open_repo(repo)
    for session in sessions:
        sid = await mem.start_session(session.goal, repo=repo)
        for told in session.steps:
            await mem.append(sid, told.observation, told.action)
        await mem.close_and_commit(sid)
        await mem.end_session(sid)


async def evaluate(
    mem: mnemo.Memory, cases: Sequence[Case] = CASES, *, k: int = 10,
    types: Sequence[mnemo.NodeType] | None = None, repo: str = REPO,
) -> Report:
    """Recalls each case's question (without reinforcing) and ranks its answer."""
    report = Report()
    for case in cases:
        result = await mem.recall(repo, case.question, k=k, types=types, reinforce=False)
        texts = [m.node.text for m in result.memories]
        rank = next((i for i, m in enumerate(result.memories, start=1)
                     if m.node.type in (mnemo.NodeType.SEMANTIC, mnemo.NodeType.PROCEDURAL)
                     and m.node.text == case.answer), None)
        report.ranks.append((case, rank, texts))
        report.rankings.append([(m.node.type.value, m.node.text, m.score)
                                for m in result.memories])
    return report
