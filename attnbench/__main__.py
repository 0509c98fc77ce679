from attnbench.cli import main

main()
