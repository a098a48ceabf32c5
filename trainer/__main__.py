from trainer.launcher.main import main

main()
