"""opforge_rl: opforge's judge as the reward of verl, OpenRLHF and TRL, through `opforge serve`.

    pip install -e python/            # standard library only
    opforge serve --tasks ws/export --port 8000 --device cuda &
    export OPFORGE_SERVE_URL=http://127.0.0.1:8000

- verl:     custom_reward_function.path = <this package>/verl.py, .name = compute_score
- OpenRLHF: --remote_rm_url http://127.0.0.1:8000/openrlhf (the service speaks it), or
            opforge_rl.openrlhf.reward_func in a reward file
- TRL:      GRPOTrainer(reward_funcs=[opforge_rl.trl.make_reward_func()], ...), with a `task_id` column

Every adapter sends the model's whole response; the service extracts the last fenced code block
(one extractor for all). Rewards are the judge's: -1 wrong, 1 correct, 2 > 5% faster than eager,
3 also > 5% faster than torch.compile. What each hands its trainer when the environment fails is
in its module's docstring.
"""
from opforge_rl.client import BadRequest, Client, EnvironmentFailure, row_reward

__all__ = ["BadRequest", "Client", "EnvironmentFailure", "row_reward"]
