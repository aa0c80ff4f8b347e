from outboxkit.cli import main

main()
