"""Training the policy: supervised fine-tuning on the best measured programs (`sft`), GRPO on
measured speedups (`grpo`, rewards from the tune loop in `reward`), preference training on
pairs the database measured (`dpo`), the data they read (`data`) and their curves (`curves`).
Apart from the proposers used at inference, since it reads the tuning database and runs the tune
loop.

    python -m gemmgen.policy.training.sft --help
"""
