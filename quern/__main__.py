from quern.cli import main

main()
