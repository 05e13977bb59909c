from phase6.cli import main

main()
