"""A learner that died, named: which rank, why (when Ray knows) and how the run resumes.

With ``num_learners > 1`` the learners form one torch.distributed group. When one of their processes dies, the
others fail inside a collective (gloo: "Connection closed by peer"), and the update raises that error, which names
neither the learner nor the fix. `dead_learners` asks each learner actor whether it is alive; `LearnerDiedError`
says which is not.

The surviving learners are stopped when the error is raised (`stop_learners`): their group is broken, and a
survivor left waiting in a collective for the dead one would hold the driver's later calls (``algo.stop()``, the
shutdown of their torch group, a background probe), and with them the driver's exit, for torch.distributed's
timeout (30 minutes). So a script that fails this way ends with the error, with or without ``algo.stop()``.

A learner group that the script never stopped (no ``algo.stop()``: the script caught the error and returned, or let
it escape) is shut down at the interpreter's exit, before Ray's own exit hook shuts Ray down
(`shut_down_at_exit`). Left to the garbage collector, RLlib's ``LearnerGroup.__del__`` would shut it down after
Ray's exit hook, and its first remote call would start a new Ray instance in the exiting interpreter, which never
ends.

Rebuilding a lost learner in place is not done: RLlib's `LearnerGroup` forms the process group once, when it starts,
and has no way to replace one of its members, so the run resumes from its last checkpoint instead (Tune does this by
itself with ``tune.FailureConfig(max_failures=N)``; the data position is part of the checkpoint, so the resumed run
trains on what the uninterrupted one would).
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from typing import Any, List, Optional, Tuple

import ray

# Seconds a live learner has to answer the liveness ping (it may still be unwinding from the failed collective).
PING_TIMEOUT_S = 10.0
# Seconds `stop_learners` waits for Ray to report a killed learner dead (the kill is asynchronous).
KILL_TIMEOUT_S = 30.0


class LearnerDiedError(RuntimeError):
    """A learner actor died during an update; the message names it and says how the run resumes."""


def dead_learners(learner_group: Any) -> List[Tuple[int, str]]:
    """``[(rank, cause), ...]`` of the learner actors of ``learner_group`` that are dead (empty for a local
    learner, or when all answer). The rank is the actor's index in the group (its torch.distributed rank)."""
    manager = getattr(learner_group, "_worker_manager", None)
    if manager is None:
        return []
    dead = []
    for rank, (_, actor) in enumerate(sorted(manager.actors().items())):
        cause = _death_cause(actor, PING_TIMEOUT_S)
        if cause is not None:
            dead.append((rank, cause))
    return dead


def stop_learners(learner_group: Any) -> None:
    """Kill every learner actor of ``learner_group`` (after one died: the group cannot train again), so that nothing
    waits on them any more: calls in flight or made later fail at once, as for the dead one.

    Returns once Ray reports each of them dead (or after `KILL_TIMEOUT_S`): ``ray.kill`` only sends the kill, and a
    call that reaches the actor before it lands would still be answered."""
    manager = getattr(learner_group, "_worker_manager", None)
    if manager is None:
        return
    actors = list(manager.actors().values())
    for actor in actors:
        ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + KILL_TIMEOUT_S
    for actor in actors:
        while _death_cause(actor, 1.0) is None and time.monotonic() < deadline:
            time.sleep(0.05)


# The learner groups with remote learners that `shut_down_at_exit` shuts down, unless they were shut down before.
_AT_EXIT: "weakref.WeakSet[Any]" = weakref.WeakSet()
_AT_EXIT_LOCK = threading.Lock()
_hook_installed = False


def shut_down_at_exit(learner_group: Any) -> None:
    """Shut ``learner_group`` down when the interpreter exits, while Ray is still up, if nothing did before (its
    algorithm's ``stop()``). A weak reference: it keeps nothing alive.

    Python runs exit hooks last registered first, and Ray registers its own (``ray.shutdown``) when it is imported,
    before any algorithm exists: this one runs before it. A local learner (``num_learners=0``) makes no remote call
    when it is shut down, and is left to RLlib."""
    global _hook_installed
    if learner_group is None or not getattr(learner_group, "is_remote", False):
        return
    with _AT_EXIT_LOCK:
        _AT_EXIT.add(learner_group)
        if not _hook_installed:
            atexit.register(_shut_down_learner_groups)
            _hook_installed = True


def _shut_down_learner_groups() -> None:
    for learner_group in list(_AT_EXIT):
        if getattr(learner_group, "_is_shut_down", False):  # stopped by its algorithm (RLlib's flag)
            continue
        try:
            if ray.is_initialized():
                learner_group.shutdown()  # bounded: dead learners fail their calls at once, live ones end
        except Exception:  # the process is exiting: Ray's exit hook ends the actors that are left
            pass
        # Whatever happened, its __del__ must not call into Ray after Ray's exit hook.
        learner_group._is_shut_down = True


def _death_cause(actor: Any, timeout_s: float) -> Optional[str]:
    """Why ``actor`` is dead, from a liveness ping; None when it answers, or is busy for ``timeout_s`` (alive, or
    not yet known to be dead)."""
    try:
        ray.get(actor.__ray_ready__.remote(), timeout=timeout_s)
    except ray.exceptions.RayActorError as e:
        return _cause(e)
    except ray.exceptions.GetTimeoutError:
        pass
    return None


def _cause(error: BaseException) -> str:
    """Ray's reason for an actor's death, in one line ("killed by ray.kill", "SIGKILL", "out of memory", ...)."""
    text = getattr(error, "error_msg", None) or str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    reasons = [line for line in lines if "actor is dead because" in line.lower() or "killed" in line.lower()]
    return (reasons or lines or ["unknown"])[0][:300]


def learner_died_error(dead: List[Tuple[int, str]], num_learners: int, iteration: int) -> LearnerDiedError:
    """The error for `dead_learners`' answer, with what to do."""
    which = "; ".join(f"learner {rank} of {num_learners} ({cause})" for rank, cause in dead)
    return LearnerDiedError(
        f"A learner actor died during the update of iteration {iteration}: {which}. The other learners cannot go on "
        "without it (their torch.distributed group is broken), so this run stops here; nothing it saved is lost. "
        "To resume from the last checkpoint: under Tune, tune.RunConfig(failure_config=tune.FailureConfig("
        "max_failures=1), checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=N)) restarts the trial from it "
        "by itself; in Python, P3O.from_checkpoint(path). If it was out of memory, lower minibatch_size or give each "
        "learner more memory."
    )


def divergence_message(iteration: int, lr: Any, error: BaseException) -> str:
    """A diverged policy (`rllib_p3o.sync.probe.PolicyDivergedError`) or too many non-finite steps in a row, said
    with the iteration (counted from 1) and the learning rate (a number, or RLlib's schedule), and what to do."""
    lr = f"{lr:g}" if isinstance(lr, (int, float)) else f"schedule {lr}"
    # A remote learner's error arrives as a Ray task error (the remote traceback in its text) whose cause is its own.
    message = str(getattr(error, "cause", None) or error).strip()
    return (
        f"Training diverged in iteration {iteration} at lr={lr}: {message} "
        "Lower the learning rate (.training(lr=...)); checkpoints written before this iteration hold the weights "
        "from before the divergence."
    )
