"""application_work: the everyday work of eight libraries built on Redis, one library per run,
against the URL it is given. A reader of the lesson need not read it: bench/applications.py
runs it in .venv-applications, where the libraries are, once directly against redis-server
and once through each pool, and reads the one line it prints at its end.

    python -m bench.application_work NAME URL     (NAME: one of WORKS; run from the clone root)

Each work function drives its library the way an application does, with the library's
defaults, checks every result it gets, and notes each step it finishes in a Record. The last
line on stdout is RESULT_MARK and a JSON object: the steps done, and, if one failed, that step
and its exception; each step prints BEGUN_MARK and its name as it begins, so a run killed at its
deadline still says where it was. Nothing at the top of this module imports a library: the
project's own venv has none of them, and each run needs only its own.

    Record, expect(), wait_until(), ended()
                         the steps done, a check, a poll and a process's end, with deadlines
    multiply() ...       the jobs the queues run, found by MODULE's name in another process
    rq_work() ...        each library's work; WORKS, the work by library name
    celery_worker()      the celery worker celery_work() starts in a process of its own
    main(argv)           run one library's work, print RESULT_MARK and what it did
"""
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback

MODULE = "bench.application_work"   # by this name a worker in another process finds its jobs
BEGUN_MARK = "application-work-begun "    # a step begun: the last one names where a hang was
RESULT_MARK = "application-work-result "
WAIT = 30.0          # seconds any one wait may take: a result, a worker's start or end
POLL = 0.1           # seconds between two looks at something awaited


class Record:
    """The steps one library's work has finished, and the one it is in."""

    def __init__(self):
        self.done = []
        self.step = None

    @contextlib.contextmanager
    def doing(self, what):
        self.step = what
        print(BEGUN_MARK + what, flush=True)
        yield
        self.done.append(what)
        self.step = None


def expect(found, wanted, what):
    if found != wanted:
        raise AssertionError(f"{what}: got {found!r}, expected {wanted!r}")


def wait_until(ready, what, timeout=WAIT):
    """Poll ready() until it is true; TimeoutError naming `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:g} s")
        time.sleep(POLL)


def ended(process, what, timeout=WAIT):
    """Wait for a worker process asked to stop; kill it, and say so, if it will not."""
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise TimeoutError(f"{what} did not end within {timeout:g} s of being asked") from None


def venv_program(name):
    """A console script of the venv this runs in (rq's `rq`)."""
    return os.path.join(os.path.dirname(sys.executable), name)


# -- the jobs every queue runs: plain functions a worker imports by MODULE's name

def multiply(x, y):
    return x * y


def total(numbers):
    return sum(numbers)


def fail_on_purpose():
    raise ValueError("this job fails on purpose")


# -- rq

def rq_work(url, record):
    from redis import Redis
    from rq import Queue, Worker
    from rq.command import send_shutdown_command
    from rq.job import JobStatus
    connection = Redis.from_url(url)
    queue = Queue("applications", connection=connection)
    with record.doing("enqueued 4 jobs and 1 that fails"):
        jobs = [queue.enqueue(f"{MODULE}.multiply", n, 3) for n in range(4)]
        failing = queue.enqueue(f"{MODULE}.fail_on_purpose")
        expect(queue.count, 5, "jobs queued")
    with record.doing("Worker.work(burst=True) ran them"):
        Worker([queue], connection=connection).work(burst=True)
    with record.doing("results and statuses read"):
        expect([job.return_value() for job in jobs], [0, 3, 6, 9], "return values")
        expect({job.get_status() for job in jobs}, {JobStatus.FINISHED}, "statuses")
        expect(failing.get_status(), JobStatus.FAILED, "the failing job's status")
    with record.doing("registries listed"):
        expect(sorted(queue.finished_job_registry.get_job_ids()), sorted(job.id for job in jobs),
               "the finished registry")
        expect(queue.failed_job_registry.get_job_ids(), [failing.id], "the failed registry")
    with record.doing("`rq worker` with its defaults ran 3 more"):
        more = [queue.enqueue(f"{MODULE}.multiply", n, 10) for n in range(3)]
        worker = subprocess.Popen([venv_program("rq"), "worker", "--url", url, "applications"],
                                  stdin=subprocess.DEVNULL)
        try:
            wait_until(lambda: all(job.get_status() == JobStatus.FINISHED for job in more),
                       "the worker process finishing 3 jobs")
            expect([job.return_value() for job in more], [0, 10, 20], "its return values")
            wait_until(lambda: Worker.all(connection=connection), "the worker registering")
            (registered,) = Worker.all(connection=connection)
        except BaseException:
            worker.kill()
            worker.wait()
            raise
    with record.doing("it stopped on a shutdown command (its pub/sub thread)"):
        send_shutdown_command(connection, registered.name)
        expect(ended(worker, "the rq worker"), 0, "its exit status")
    connection.close()


# -- celery

def celery_app(url):
    from celery import Celery
    app = Celery("applications", broker=url, backend=url)
    app.task(name="applications.multiply")(multiply)
    app.task(name="applications.total")(total)
    return app


def celery_worker(url):
    """A celery worker in this process, with one execution pool (solo), until SIGTERM."""
    celery_app(url).worker_main(["worker", "--pool=solo"])


def celery_work(url, record):
    from celery import chord, group
    app = celery_app(url)
    multiply_task, total_task = (app.tasks["applications.multiply"],
                                 app.tasks["applications.total"])
    with record.doing("a worker process started (--pool=solo)"):
        worker = subprocess.Popen([sys.executable, "-m", MODULE, "celery-worker", url],
                                  stdin=subprocess.DEVNULL)
    try:
        with record.doing("5 tasks sent, each .get()"):
            sent = [multiply_task.delay(n, 2) for n in range(5)]
            expect([result.get(timeout=WAIT) for result in sent], [0, 2, 4, 6, 8], "results")
        with record.doing("a group"):
            together = group(multiply_task.s(n, 5) for n in range(4))()
            expect(together.get(timeout=WAIT), [0, 5, 10, 15], "the group's results")
        with record.doing("a chord"):
            summed = chord(multiply_task.s(n, n) for n in range(4))(total_task.s())
            expect(summed.get(timeout=WAIT), 14, "the chord's total")
    except Exception as error:
        if worker.poll() is not None:   # a result never came because no worker was left
            raise ChildProcessError(f"the worker had ended by itself, status "
                                    f"{worker.returncode}; then {type(error).__name__}: "
                                    f"{error}") from error
        raise
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)   # its warm shutdown
        status = ended(worker, "the celery worker")
    with record.doing("the worker stopped on SIGTERM"):
        expect(status, 0, "its exit status")
    app.close()


# -- huey

def huey_work(url, record):
    from huey import RedisHuey
    huey = RedisHuey("applications", url=url)
    multiply_task = huey.task(name="multiply")(multiply)
    consumer = huey.create_consumer(workers=2, worker_type="thread")
    with record.doing("a consumer of 2 threads started"):
        consumer.start()
    try:
        with record.doing("5 tasks enqueued, results read"):
            sent = [multiply_task(n, 4) for n in range(5)]
            expect([result.get(blocking=True, timeout=WAIT) for result in sent],
                   [0, 4, 8, 12, 16], "results")
        with record.doing("a task scheduled 1 s ahead"):
            later = multiply_task.schedule((6, 7), delay=1)
            expect(later.get(blocking=True, timeout=WAIT), 42, "its result")
    finally:
        consumer.stop(graceful=True)
    huey.storage.close()


# -- dramatiq

def dramatiq_work(url, record):
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.results import Results
    from dramatiq.results.backends.redis import RedisBackend
    broker = RedisBroker(url=url)
    broker.add_middleware(Results(backend=RedisBackend(url=url)))
    dramatiq.set_broker(broker)
    actor = dramatiq.actor(multiply, actor_name="multiply", store_results=True, broker=broker)
    worker = dramatiq.Worker(broker, worker_threads=2)
    with record.doing("a Worker of 2 threads started"):
        worker.start()
    try:
        with record.doing("5 messages sent, results read"):
            sent = [actor.send(n, 5) for n in range(5)]
            expect([message.get_result(block=True, timeout=int(WAIT * 1000)) for message in sent],
                   [0, 5, 10, 15, 20], "results")
        with record.doing("the queue joined"):
            broker.join(actor.queue_name, timeout=int(WAIT * 1000))
    finally:
        worker.stop(timeout=int(WAIT * 1000))
        broker.close()


# -- django-redis

def django_redis_work(url, record):
    import django
    from django.conf import settings
    settings.configure(CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache",
                                           "LOCATION": url}})
    django.setup()
    from django.core.cache import cache
    with record.doing("set, get"):
        cache.set("applications:greeting", "hello", timeout=60)
        expect(cache.get("applications:greeting"), "hello", "get")
    with record.doing("incr"):
        cache.set("applications:counter", 1)
        expect(cache.incr("applications:counter"), 2, "incr")
    with record.doing("keys('applications:*')"):
        cache.set_many({f"applications:many:{n}": n for n in range(3)})
        expect(sorted(cache.keys("applications:*")),
               ["applications:counter", "applications:greeting"]
               + [f"applications:many:{n}" for n in range(3)], "keys")
    with record.doing("delete_many"):
        cache.delete_many([f"applications:many:{n}" for n in range(3)])
        expect(cache.get_many([f"applications:many:{n}" for n in range(3)]), {}, "after it")
    with record.doing("ttl"):
        expect(55 <= cache.ttl("applications:greeting") <= 60, True, "a ttl within the minute")
    with record.doing("lock"):
        with cache.lock("applications:lock", timeout=5):
            expect(cache.lock("applications:lock").acquire(blocking=False), False,
                   "a second holder")
        expect(cache.lock("applications:lock").acquire(blocking=False), True, "after release")
    cache.close()


# -- limits

def limits_work(url, record):
    from limits import parse, strategies
    from limits.storage import RedisStorage
    storage = RedisStorage(url)
    five_a_minute = parse("5/minute")
    for name, strategy in (("moving-window", strategies.MovingWindowRateLimiter),
                           ("fixed-window", strategies.FixedWindowRateLimiter),
                           ("sliding-window", strategies.SlidingWindowCounterRateLimiter)):
        with record.doing(f"{name}: 6 hits, window stats"):
            limiter = strategy(storage)
            expect([limiter.hit(five_a_minute, "applications", name) for _ in range(6)],
                   [True] * 5 + [False], "hits")
            expect(limiter.get_window_stats(five_a_minute, "applications", name).remaining, 0,
                   "remaining")
    with record.doing("storage.reset()"):
        expect(storage.reset() > 0, True, "keys cleared")
        expect(strategies.FixedWindowRateLimiter(storage).hit(five_a_minute, "applications",
                                                              "fixed-window"),
               True, "a hit after the reset")


# -- flask-limiter

def flask_limiter_work(url, record):
    from flask import Flask
    from flask_limiter import Limiter
    from flask_limiter.util import get_remote_address
    app = Flask("applications")
    limiter = Limiter(get_remote_address, app=app, storage_uri=url)

    @app.route("/ping")
    @limiter.limit("3 per minute")
    def ping():
        return "pong"

    with record.doing("a route limited to 3 a minute, hit until 429"):
        client = app.test_client()
        expect([client.get("/ping").status_code for _ in range(5)], [200, 200, 200, 429, 429],
               "status codes")


# -- arq

async def arq_multiply(context, x, y):
    return x * y


def arq_work(url, record):
    from arq import create_pool
    from arq.connections import RedisSettings
    from arq.worker import run_worker
    settings = RedisSettings.from_dsn(url)

    async def enqueue():
        redis = await create_pool(settings)
        jobs = [await redis.enqueue_job("arq_multiply", n, 6) for n in range(5)]
        await redis.aclose()
        return [job.job_id for job in jobs]

    async def results(job_ids):
        from arq.jobs import Job
        redis = await create_pool(settings)
        try:
            found = [await Job(job_id, redis).result(timeout=WAIT) for job_id in job_ids]
            every = await redis.all_job_results()
        finally:
            await redis.aclose()
        return found, sorted(result.job_id for result in every)

    class WorkerSettings:
        functions = [arq_multiply]
        redis_settings = settings
        burst = True

    with record.doing("5 jobs enqueued"):
        job_ids = asyncio.run(enqueue())
    with record.doing("a worker (burst=True) ran them"):
        worker = run_worker(WorkerSettings)
        expect(worker.jobs_complete, 5, "jobs complete")
    with record.doing("job.result(), all_job_results()"):
        found, every = asyncio.run(results(job_ids))
        expect(found, [0, 6, 12, 18, 24], "results")
        expect(every, sorted(job_ids), "every job's result")


WORKS = {"rq": rq_work, "celery": celery_work, "huey": huey_work, "dramatiq": dramatiq_work,
         "django-redis": django_redis_work, "limits": limits_work,
         "flask-limiter": flask_limiter_work, "arq": arq_work}


def main(argv=None):
    name, url = (sys.argv[1:] if argv is None else argv)
    if name == "celery-worker":
        celery_worker(url)
        return 0
    record = Record()
    outcome = {"did": record.done}
    try:
        WORKS[name](url, record)
    except BaseException as error:   # a library's own exception of any kind is the finding
        traceback.print_exc()
        outcome.update(step=record.step, error=f"{type(error).__name__}: {error}")
    print(RESULT_MARK + json.dumps(outcome), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
