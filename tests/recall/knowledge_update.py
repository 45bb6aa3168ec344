"""The knowledge-update suite: facts an agent learned, corrected in a later session, and
questions whose answer is the current value.

Each `Update` is told twice: first in one of the early sessions, then, corrected, in one of
the later ones (another day, another task). The test model (`SuiteLLM` with these sessions
and corrections) extracts exactly the fact written beside each step and answers the
"contradiction" task with the pairs below, as a good model would; whether a correction
reaches the older fact (it must be among the facts compared with it) is the pipeline's. A
recall meets the suite when the current fact ranks first (hit@1), above the fact it replaced
and the steps that told either. `tests/recall/test_knowledge_update.py` requires hit@1 >= 0.9;
`scripts/eval_recall.py` reports it beside the fact-first suite and LoCoMo.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.recall.fact_first import Case, Session, Told


@dataclass(frozen=True, slots=True)
class Update:
    """A fact as first told, then as corrected, and the question the correction answers."""

    told: str
    fact: str
    later: str
    current: str
    question: str


U = Update
UPDATES: tuple[Update, ...] = (
    # People and the team
    U("Dana says she lives in Lisbon and walks to the office.", "Dana lives in Lisbon.",
      "Dana moved to Porto last month; she works remotely now.", "Dana lives in Porto.",
      "where does Dana live?"),
    U("Lena is the on-call engineer this week.", "Lena is the on-call engineer.",
      "On-call passed from Lena to Omar this morning.", "Omar is the on-call engineer.",
      "who is on call?"),
    U("Priya leads the payments team.", "Priya leads the payments team.",
      "Priya handed the payments team over to Jonas; she leads search now.",
      "Jonas leads the payments team.", "who leads the payments team?"),
    U("The team standup is at 9:30 every morning.", "The team standup is at 9:30.",
      "Standup moved to 10:15 so the Berlin office can join.", "The team standup is at 10:15.",
      "what time is the standup?"),
    U("Sprint reviews happen every second Friday.", "Sprint reviews are every second Friday.",
      "We switched to sprint reviews every second Thursday.",
      "Sprint reviews are every second Thursday.", "when are sprint reviews?"),
    U("Marco's desk phone extension is 4410.", "Marco's phone extension is 4410.",
      "Marco has a new extension after the office move: 5172.",
      "Marco's phone extension is 5172.", "what is Marco's phone extension?"),
    U("The design lead is Aiko.", "The design lead is Aiko.",
      "Aiko left; Ruth is the design lead from today.", "The design lead is Ruth.",
      "who is the design lead?"),
    U("New hires get a MacBook Pro with 16 GB of memory.",
      "New hires get a laptop with 16 GB of memory.",
      "IT now hands new hires laptops with 32 GB of memory.",
      "New hires get a laptop with 32 GB of memory.",
      "how much memory do new hires' laptops have?"),
    U("The quarterly planning offsite is in Ghent.", "The planning offsite is in Ghent.",
      "The offsite venue changed to Utrecht because Ghent was booked.",
      "The planning offsite is in Utrecht.", "where is the planning offsite?"),
    U("Sofia prefers code reviews over email.", "Sofia prefers code reviews by email.",
      "Sofia now wants review requests in Slack, not email.",
      "Sofia prefers code reviews in Slack.", "how does Sofia want code review requests?"),
    # Infrastructure
    U("The primary database runs PostgreSQL 14.", "The primary database runs PostgreSQL 14.",
      "The primary database was upgraded to PostgreSQL 16 last night.",
      "The primary database runs PostgreSQL 16.",
      "which PostgreSQL version does the primary database run?"),
    U("Redis lives on cache-1.internal.", "Redis runs on cache-1.internal.",
      "Redis was migrated to cache-3.internal after the disk failure.",
      "Redis runs on cache-3.internal.", "which host runs Redis?"),
    U("The API is served from the eu-west-1 region.", "The API runs in eu-west-1.",
      "The API moved to eu-central-1 for lower latency.", "The API runs in eu-central-1.",
      "which region does the API run in?"),
    U("Nightly backups run at 02:00 UTC.", "Nightly backups run at 02:00 UTC.",
      "Backups now start at 03:30 UTC, after the batch jobs.", "Nightly backups run at 03:30 UTC.",
      "when do nightly backups run?"),
    U("Backups are kept for 14 days.", "Backups are kept for 14 days.",
      "Compliance asked us to keep backups for 35 days.", "Backups are kept for 35 days.",
      "how long are backups kept?"),
    U("The Kubernetes cluster has 3 worker nodes.", "The cluster has 3 worker nodes.",
      "We scaled the cluster to 5 worker nodes for the launch.", "The cluster has 5 worker nodes.",
      "how many worker nodes does the cluster have?"),
    U("The staging URL is staging.acme.io.", "The staging URL is staging.acme.io.",
      "Staging now lives at stage.acme.dev after the domain change.",
      "The staging URL is stage.acme.dev.", "what is the staging URL?"),
    U("Logs are shipped to Papertrail.", "Logs are shipped to Papertrail.",
      "We moved log shipping from Papertrail to Grafana Loki.", "Logs are shipped to Grafana Loki.",
      "where are logs shipped?"),
    U("The CDN is Cloudflare.", "The CDN is Cloudflare.",
      "Static assets are now served through Fastly instead of Cloudflare.", "The CDN is Fastly.",
      "which CDN do we use?"),
    U("TLS certificates come from Let's Encrypt.", "TLS certificates come from Let's Encrypt.",
      "Certificates are now issued by ZeroSSL after the rate-limit trouble.",
      "TLS certificates come from ZeroSSL.", "who issues our TLS certificates?"),
    U("The message queue is RabbitMQ.", "The message queue is RabbitMQ.",
      "We replaced RabbitMQ with NATS for the queue.", "The message queue is NATS.",
      "which message queue do we use?"),
    U("The VPN gateway is vpn.acme.io on port 1194.", "The VPN gateway listens on port 1194.",
      "The VPN gateway was moved to port 51820 with WireGuard.",
      "The VPN gateway listens on port 51820.", "which port does the VPN gateway listen on?"),
    # Application settings
    U("The API rate limit is 100 requests per minute.",
      "The API rate limit is 100 requests per minute.",
      "The rate limit was raised to 250 requests per minute for the launch.",
      "The API rate limit is 250 requests per minute.", "what is the API rate limit?"),
    U("User sessions expire after 24 hours.", "User sessions expire after 24 hours.",
      "Security review: sessions now expire after 8 hours.", "User sessions expire after 8 hours.",
      "when do user sessions expire?"),
    U("Password reset links are valid for one hour.",
      "Password reset links are valid for one hour.",
      "Reset links now stay valid for 15 minutes only.",
      "Password reset links are valid for 15 minutes.", "how long are password reset links valid?"),
    U("Uploads are limited to 10 MB.", "Uploads are limited to 10 MB.",
      "The upload limit was raised to 50 MB for video files.", "Uploads are limited to 50 MB.",
      "what is the upload size limit?"),
    U("Search results are paginated at 20 per page.", "Search results show 20 per page.",
      "Search pagination changed to 50 results per page.", "Search results show 50 per page.",
      "how many search results are on a page?"),
    U("Transactional email goes out through Mailgun.",
      "Transactional email is sent through Mailgun.",
      "We switched transactional email from Mailgun to Postmark.",
      "Transactional email is sent through Postmark.", "which service sends transactional email?"),
    U("The default currency in the shop is USD.", "The shop's default currency is USD.",
      "The shop's default currency is now EUR since the EU launch.",
      "The shop's default currency is EUR.", "what is the shop's default currency?"),
    U("Free trials last 14 days.", "Free trials last 14 days.",
      "Marketing extended free trials to 30 days.", "Free trials last 30 days.",
      "how long do free trials last?"),
    U("Celery workers run 4 processes each.", "Each celery worker runs 4 processes.",
      "Each celery worker now runs 8 processes after the upgrade.",
      "Each celery worker runs 8 processes.", "how many processes does each celery worker run?"),
    U("Gunicorn's worker timeout is 30 seconds.", "Gunicorn's worker timeout is 30 seconds.",
      "The report page needed more time, so gunicorn's timeout is 90 seconds now.",
      "Gunicorn's worker timeout is 90 seconds.", "what is gunicorn's worker timeout?"),
    U("The feature flag service is LaunchDarkly.", "Feature flags are managed in LaunchDarkly.",
      "We moved feature flags from LaunchDarkly to Unleash.",
      "Feature flags are managed in Unleash.",
      "where are feature flags managed?"),
    U("The mobile app's minimum iOS version is 15.", "The app supports iOS 15 and later.",
      "The app dropped iOS 15; the minimum is iOS 16 now.", "The app supports iOS 16 and later.",
      "which iOS versions does the app support?"),
    # Process and tools
    U("Deploys happen on Tuesdays and Thursdays.", "The team deploys on Tuesdays and Thursdays.",
      "After the retro the team deploys every weekday but Friday.",
      "The team deploys every weekday but Friday.", "on which days does the team deploy?"),
    U("CI runs on Jenkins.", "CI runs on Jenkins.",
      "We finished moving CI from Jenkins to GitHub Actions.", "CI runs on GitHub Actions.",
      "which CI system do we use?"),
    U("Issues are tracked in Jira.", "Issues are tracked in Jira.",
      "The team moved issue tracking to Linear.", "Issues are tracked in Linear.",
      "where are issues tracked?"),
    U("The code freeze before a release is 3 days.", "The code freeze before a release is 3 days.",
      "Code freeze was shortened to one day before a release.",
      "The code freeze before a release is one day.",
      "how long is the code freeze before a release?"),
    U("Pull requests need one approval.", "Pull requests need one approval.",
      "Pull requests now need two approvals after the incident.",
      "Pull requests need two approvals.", "how many approvals does a pull request need?"),
    U("Python code is formatted with black.", "Python code is formatted with black.",
      "We replaced black with ruff format for Python.",
      "Python code is formatted with ruff format.",
      "which formatter do we use for Python?"),
    U("The main branch is called master.", "The main branch is called master.",
      "The default branch was renamed from master to main.", "The main branch is called main.",
      "what is the main branch called?"),
    U("Secrets are kept in HashiCorp Vault.", "Secrets are kept in HashiCorp Vault.",
      "Secrets moved from Vault to AWS Secrets Manager.",
      "Secrets are kept in AWS Secrets Manager.",
      "where are secrets kept?"),
    U("The incident channel is #ops-alerts.", "The incident channel is #ops-alerts.",
      "Incidents are now handled in #incident-room.", "The incident channel is #incident-room.",
      "which channel is used for incidents?"),
    U("Customer support answers within 48 hours.", "Support answers within 48 hours.",
      "Support now promises an answer within 24 hours.", "Support answers within 24 hours.",
      "how fast does support answer?"),
    U("The office Wi-Fi network is acme-guest.", "The office Wi-Fi network is acme-guest.",
      "The office Wi-Fi was renamed to acme-office.", "The office Wi-Fi network is acme-office.",
      "what is the office Wi-Fi network called?"),
)

# Which early session tells each update's first fact, which later one its correction: a few
# topics each, so that a session holds unrelated facts as a real one does.
_FIRST = ("Onboarding notes", "Infrastructure tour", "Settings audit", "Team practices")
_LATER = ("Catch-up after the holidays", "Migration week", "Launch preparation",
          "Retro follow-ups")


def _sessions() -> tuple[Session, ...]:
    early: list[list[Told]] = [[] for _ in _FIRST]
    late: list[list[Told]] = [[] for _ in _LATER]
    for n, update in enumerate(UPDATES):
        early[n % len(_FIRST)].append(Told(update.told, "Note it.", facts=(update.fact,)))
        late[(n * 3) % len(_LATER)].append(Told(update.later, "Update the notes.",
                                                facts=(update.current,)))
    return (*(Session(goal, tuple(steps)) for goal, steps in zip(_FIRST, early, strict=True)),
            *(Session(goal, tuple(steps)) for goal, steps in zip(_LATER, late, strict=True)))


SESSIONS = _sessions()
CORRECTIONS: frozenset[tuple[str, str]] = frozenset((u.fact, u.current) for u in UPDATES)
CASES: tuple[Case, ...] = tuple(Case(u.question, u.current) for u in UPDATES)
