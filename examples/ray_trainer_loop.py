"""A trainer loop on an adapter pool: open sessions, run one harness per session against its
URL, finish them all at once, pack the samples. The scripted engine stands in for SGLang."""

import asyncio

import ray

from tokentrail.scale import ActorSpec, AdapterPool, PooledSession
from tokentrail.sim.harness import HarnessSim, SimResult, Workspace

TASK = "Fix the spacing in calc.py, add util.py with mul(), and write NOTES.md."


async def rollout(session: PooledSession) -> SimResult:
    # Any harness works: a real one gets ANTHROPIC_BASE_URL=session.url and the session id
    # as its API key (ANTHROPIC_AUTH_TOKEN=session.sid), and every turn reaches this actor.
    harness = HarnessSim(session.url, session.sid, workspace=Workspace())
    return await harness.run(TASK)


async def rollouts(sessions: list[PooledSession]) -> list[SimResult]:
    return await asyncio.gather(*(rollout(s) for s in sessions))


def main(steps: int = 2, sessions_per_step: int = 8) -> None:
    # On a cluster: ActorSpec(engine="sglang://10.0.0.5:30000", tokenizer="/models/Qwen3-8B"),
    # and node_resource="rollout" to put one adapter on each node that offers {"rollout": 1}.
    spec = ActorSpec(engine="scripted")
    with AdapterPool(spec, num_actors=2) as pool:
        for step in range(steps):
            sessions = [pool.open_session() for _ in range(sessions_per_step)]
            results = asyncio.run(rollouts(sessions))
            # Your verifier goes here; this one rewards a session that ended with an answer.
            rewards = {
                s.sid: float(bool(r.final_text)) for s, r in zip(sessions, results, strict=True)
            }
            batch = pool.finish_many(rewards)  # every actor at once, through the object store
            packed = batch.pack()  # cu_seqlens, position_ids, loss_mask, logprobs, rewards
            ledger = batch.ledger()
            print(
                f"step {step}: {len(batch.sessions)} sessions, {packed.num_samples} samples, "
                f"{packed.num_tokens} tokens, {ledger.trained_tokens}/{ledger.generated_tokens} "
                f"generated tokens trained, {len(batch.lost)} lost"
            )
            # trainer.step(packed.to_torch())


if __name__ == "__main__":
    ray.init()
    main()
