"""What every benchmark suite shares: machine facts, the timing harness, the idle-CPU
wait, figure style, ShareGPT loading and where results go."""
